"""Tests of the pure-PyTorch GradInit engine (fairseq_gradinit.core), CPU only and small."""
import copy
import dataclasses
import math
import os
import socket
import time
import warnings
from datetime import timedelta

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import (
    BatchPair,
    GradInit,
    GradInitConfig,
    apply_scales,
    gradinit,
    gradinit_mode,
    math_attention,
    overlapping_pairs,
)
from fairseq_gradinit.core.engine import (
    constraint_grad,
    constraint_grad_fd,
    foreach_norm,
    grad_norm,
    objective_grad,
    step_direction,
)
from fairseq_gradinit.core.runtime import gradients
from fairseq_gradinit.core.scales import ScaledParameters
from tiny_models import TinyTransformer, central_differences, lm_loss

# --------------------------------------------------------------------------------------------
# helpers (module level so that spawned processes can unpickle them)
# --------------------------------------------------------------------------------------------


def ce_loss(model, batch):
    x, y = batch[0], batch[1]
    return F.cross_entropy(model(x), y)


def make_mlp(seed=0, dims=(6, 16, 3), weight_scale=1.0, dtype=torch.float64, act=nn.Tanh):
    torch.manual_seed(seed)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(act())
    model = nn.Sequential(*layers).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(weight_scale)
    return model


def make_batches(n, bs=8, d_in=6, n_cls=3, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, d_in, generator=g, dtype=dtype), torch.randint(0, n_cls, (bs,), generator=g))
            for _ in range(n)]


def make_pairs(n, seed=1, **kw):
    b = make_batches(2 * n, seed=seed, **kw)
    return [BatchPair(b[2 * i], b[2 * i + 1]) for i in range(n)]


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_close(actual, expected, rtol, atol):
    # (torch.testing.assert_close imports torch.distributed.tensor and sympy: very slow to load)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    err = (actual - expected).abs()
    bad = err > atol + rtol * expected.abs()
    assert not bad.any(), (f"{int(bad.sum())}/{bad.numel()} elements differ; max abs error "
                           f"{err.max().item():.3g}\nactual   {actual}\nexpected {expected}")


def assert_params_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


class FDNet(nn.Module):
    """Linear, LayerNorm, Embedding, BatchNorm1d and multi-head attention (through SDPA)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.ln = nn.LayerNorm(8)
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 3)

    def forward(self, tokens):
        x = self.emb(tokens)
        a, _ = self.attn(x, x, x, need_weights=False)
        x = self.ln(x + a).mean(1)
        return self.out(torch.tanh(self.bn(self.lin(x))))


def token_batch(g, bs=6, seq=5, vocab=11, n_cls=3):
    return (torch.randint(0, vocab, (bs, seq), generator=g), torch.randint(0, n_cls, (bs,), generator=g))


@pytest.fixture
def count_sdpa(monkeypatch):
    """Count calls of F.scaled_dot_product_attention (the path of need_weights=False attention)."""
    calls = []
    orig = F.scaled_dot_product_attention

    def wrapped(*args, **kwargs):
        calls.append(1)
        return orig(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", wrapped)
    return calls


# --------------------------------------------------------------------------------------------
# 1. finite-difference checks of the scale gradients
# --------------------------------------------------------------------------------------------

FD_CASES = [
    ("adam", "grad", "constraint"),
    ("adam", "grad", "objective"),
    ("sgd", "grad", "constraint"),
    ("sgd", "grad", "objective"),
    ("sgd", "normalized", "constraint"),
    ("sgd", "normalized", "objective"),
]


@pytest.mark.parametrize("optimizer,sgd_step,branch", FD_CASES)
def test_scale_gradients_match_finite_differences(optimizer, sgd_step, branch, count_sdpa):
    torch.manual_seed(0)
    model = FDNet().double().train()
    with torch.no_grad():  # make every tensor non-zero (and non-trivial) so that each gets a scale
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    g = torch.Generator().manual_seed(3)
    s, s_tilde = token_batch(g), token_batch(g)
    eta = 0.05
    cfg = GradInitConfig(optimizer=optimizer, sgd_step=sgd_step, eta=eta, gamma=1.0, iters=1)
    engine = GradInit(model, ce_loss, cfg)
    sc = engine.target.scaled
    assert len(sc.params) == len(list(model.parameters()))  # everything is scaled
    engine.state.alpha.copy_(torch.empty_like(engine.state.alpha).uniform_(0.6, 1.4))
    base = engine.state.alpha.double().clone()
    p_norm = 1 if optimizer == "adam" else 2

    with gradinit_mode(model):
        # -- the engine's analytic gradient, exactly as GradInit.step computes it
        sc.write(engine.state.alpha)
        grads = gradients(ce_loss(model, s), sc.params)
        gnorm = grad_norm(grads, engine.cfg.norm_p)
        if branch == "constraint":
            analytic = constraint_grad(engine.target, engine.state.alpha, s, grads, gnorm, engine.cfg)
            direction = None
        else:
            direction = [d.detach().clone() for d in step_direction([x.clone() for x in grads], gnorm, engine.cfg,
                                                                    engine.state.gamma)]
            analytic, _ = objective_grad(engine.target, engine.state.alpha, s_tilde, direction, engine.cfg)
        analytic = analytic.double()
        if optimizer == "adam" and branch == "objective":
            assert all(torch.equal(d, x.sign()) for d, x in zip(direction, grads))
        if optimizer == "sgd" and sgd_step == "normalized" and branch == "objective":
            dn = torch.sqrt(sum((d ** 2).sum() for d in direction))
            assert dn.item() == pytest.approx(cfg.resolved_gamma, rel=1e-5)

        # -- an independent float64 reference: central differences in alpha
        def write(alpha):
            with torch.no_grad():
                for i, (p, w) in enumerate(zip(sc.params, sc.W)):
                    v = alpha[i] * w
                    if direction is not None:
                        v = v - eta * direction[i]
                    p.copy_(v)

        def f(alpha):
            write(alpha)
            with math_attention():
                if branch == "objective":
                    with torch.no_grad():
                        return ce_loss(model, s_tilde).item() / eta
                gr = gradients(ce_loss(model, s), sc.params)
            if p_norm == 1:
                return sum(x.abs().sum() for x in gr).item()
            return math.sqrt(sum((x ** 2).sum() for x in gr).item())

        h = 1e-6
        fd = central_differences(f, base, h)
        if branch == "constraint":  # the quantity differentiated is the norm the engine reports
            assert f(base) == pytest.approx(gnorm.item(), rel=1e-6)

    assert count_sdpa, "attention did not go through scaled_dot_product_attention"
    assert fd.abs().max() > 1e-3  # non-trivial
    assert_close(analytic, fd, rtol=1e-4, atol=1e-5 * fd.abs().max().item())
    # directional derivative along a random direction (robust to the l1 kinks of single coords)
    u = torch.randn_like(base)
    dd = (f(base + h * u) - f(base - h * u)) / (2 * h)
    assert (analytic @ u).item() == pytest.approx(dd, rel=1e-4, abs=1e-5 * fd.abs().max().item())


# --------------------------------------------------------------------------------------------
# 2. the constraint branch drives ||g|| below gamma
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("constraint_grad", ["exact", "finite_difference"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_constraint_branch_reduces_grad_norm_below_gamma(optimizer, constraint_grad):
    model = make_mlp(dims=(6, 16, 16, 3), weight_scale=3.0, act=nn.ReLU)
    batches = make_batches(6)
    cfg = GradInitConfig(optimizer=optimizer, eta=0.01, iters=1, lr=0.05, constraint_grad=constraint_grad)
    g0 = GradInit(copy.deepcopy(model), ce_loss, cfg)
    grads = gradients(ce_loss(g0.target.model, batches[0]), g0.target.scaled.params)
    gamma = grad_norm(grads, g0.cfg.norm_p).item() / 4
    res = gradinit(model, batches, ce_loss, cfg, gamma=gamma, iters=60)
    branches = [r.branch for r in res.history]
    assert branches[0] == "constraint"
    assert "objective" in branches
    first_obj = branches.index("objective")
    assert all(b == "constraint" for b in branches[:first_obj])
    assert res.history[0].grad_norm > 3 * gamma
    for r in res.history:  # the branch follows the rule ||g|| > gamma
        assert (r.grad_norm > gamma) == (r.branch == "constraint")
        assert (r.loss_s_tilde is not None) == (r.branch == "objective")
    # starting at ~4 gamma, ||g|| is brought down to hover around gamma
    norms = [r.grad_norm / gamma for r in res.history]
    assert sum(norms[-20:]) / 20 < 0.5 * sum(norms[:5]) / 5
    assert max(norms[-20:]) < 2.5
    assert res.num_constraint + res.num_objective == 60


def test_second_order_graph_reused_only_after_constraint_iterations(monkeypatch):
    """After a constraint iteration the first pass over S keeps its graph (one pass instead of two);
    this gives the same scales, and iterations after objective ones stay first order."""
    cfg = GradInitConfig(optimizer="adam", eta=0.01, lr=0.1, iters=1)
    model = make_mlp(dims=(6, 16, 16, 3), weight_scale=3.0)
    pairs = make_pairs(30)
    gnorm0 = GradInit(copy.deepcopy(model), ce_loss, cfg)
    grads = gradients(ce_loss(gnorm0.target.model, pairs[0][0]), gnorm0.target.scaled.params)
    gamma = grad_norm(grads, gnorm0.cfg.norm_p).item() / 2

    second_order = []
    orig_grad = torch.autograd.grad

    def spy(*args, **kwargs):
        if kwargs.get("create_graph"):
            second_order.append(engines_step[0])
        return orig_grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", spy)
    engines_step = [0]
    runs = {}
    for reuse in (True, False):
        m = copy.deepcopy(model)
        engine = GradInit(m, ce_loss, dataclasses.replace(cfg, gamma=gamma, reuse_graph=reuse))
        second_order.clear()
        per_iter = []
        with gradinit_mode(m):
            for i, pair in enumerate(pairs):
                engines_step[0] = i
                before = len(second_order)
                engine.step(pair)
                per_iter.append(len(second_order) - before)
            engine.finalize()
        runs[reuse] = (engine.state.alpha.clone(), [r.branch for r in engine.history], per_iter)
    (a1, br1, n1), (a0, br0, n0) = runs[True], runs[False]
    assert br1 == br0, (br1, br0)
    assert br1 and "constraint" in br1 and "objective" in br1
    assert_close(a1, a0, rtol=1e-10, atol=1e-12)
    for i, b in enumerate(br1):
        follows_constraint = i > 0 and br1[i - 1] == "constraint"
        # one create_graph pass per constraint iteration, reused when speculated; objective
        # iterations build a second-order graph only right after a constraint iteration
        assert n1[i] == (1 if (b == "constraint" or follows_constraint) else 0), (i, br1, n1)
        assert n0[i] == (1 if b == "constraint" else 0), (i, br0, n0)


def _constraint_grads_both_ways(model, batch, loss_fn, optimizer, fd_eps):
    cfg = GradInitConfig(optimizer=optimizer, eta=1e-3, gamma=1e-9, lr=1e-3, fd_eps=fd_eps,
                         constraint_grad="finite_difference")
    with gradinit_mode(model):
        engine = GradInit(model, loss_fn, cfg)
        params = engine.target.scaled.params
        grads = gradients(loss_fn(model, batch), params)
        gnorm = grad_norm(grads, engine.cfg.norm_p)
        exact = constraint_grad(engine.target, engine.state.alpha, batch, grads, gnorm, engine.cfg).double()
        fd = constraint_grad_fd(engine.target, engine.state.alpha, batch, grads, gnorm, engine.cfg).double()
        engine.finalize()
    return exact, fd


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_finite_difference_constraint_grad_matches_exact(optimizer, monkeypatch):
    """On smooth models the forward difference of g along v approximates the double backward."""
    model = make_mlp(dims=(6, 16, 16, 3), weight_scale=2.0)  # tanh, float64
    exact, fd = _constraint_grads_both_ways(model, make_batches(1)[0], ce_loss, optimizer, 1e-5)
    assert (fd - exact).norm() < 1e-3 * exact.norm()
    torch.manual_seed(0)
    tt = TinyTransformer()  # float32, ReLU FFN, attention
    exact, fd = _constraint_grads_both_ways(tt, torch.randint(0, 20, (8, 12)), lm_loss, optimizer, 1e-4)
    assert (fd - exact).norm() < 2e-2 * exact.norm()
    # a whole run in this mode never builds a second-order graph
    calls = []
    orig_grad = torch.autograd.grad

    def spy(*args, **kwargs):
        calls.append(kwargs.get("create_graph", False))
        return orig_grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", spy)
    res = gradinit(make_mlp(dims=(6, 16, 3), weight_scale=3.0), make_pairs(6), ce_loss,
                   GradInitConfig(optimizer=optimizer, eta=0.01, gamma=1e-9, lr=0.05, iters=6,
                                  constraint_grad="finite_difference"))
    assert res.num_constraint == 6 and calls and not any(calls)


# --------------------------------------------------------------------------------------------
# 3. clamping
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_scale", [None, 1.5])
def test_scales_are_clamped(max_scale):
    model = make_mlp(dims=(6, 16, 16, 3))
    cfg = GradInitConfig(eta=0.1, gamma=1e3, lr=1.0, min_scale=0.4, max_scale=max_scale, iters=15)
    engine = GradInit(model, ce_loss, cfg)
    seen = []
    with gradinit_mode(model):
        for pair in overlapping_pairs(make_batches(16), 0.5):
            engine.step(pair)
            a = engine.state.alpha.clone()
            seen.append(a)
            assert a.min().item() >= 0.4
            if max_scale is not None:
                assert a.max().item() <= max_scale
    engine.finalize()
    allv = torch.stack(seen)
    assert (allv == 0.4).any(), "lr=1 should push some scale onto the lower bound"
    if max_scale is not None:
        assert (allv == max_scale).any(), "lr=1 should push some scale onto the upper bound"
    for p, w, a in zip(engine.target.scaled.params, engine.target.scaled.W, engine.state.alpha):
        assert torch.equal(p.detach(), w * a)


# --------------------------------------------------------------------------------------------
# 4. zero tensors and tied parameters
# --------------------------------------------------------------------------------------------


class TiedLM(nn.Module):
    def __init__(self, vocab=10, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, vocab)
        self.out.weight = self.emb.weight
        with torch.no_grad():
            self.proj.bias.zero_()
            self.out.bias.zero_()

    def forward(self, tokens):
        return self.out(torch.tanh(self.proj(self.emb(tokens))))


def test_zero_tensors_unscaled_and_tied_parameters_get_one_scale():
    torch.manual_seed(0)
    model = TiedLM().double()
    w_emb = model.emb.weight.detach().clone()
    w_proj = model.proj.weight.detach().clone()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 10, (4, 6), generator=g) for _ in range(6)]
    res = gradinit(model, batches, lm_loss, GradInitConfig(eta=0.05, gamma=1e3, lr=0.05, iters=5))
    assert set(res.scales) == {"emb.weight", "proj.weight"}
    assert res.aliases == {"emb.weight": ["out.weight"]}
    assert res.to_dict()["aliases"] == {"emb.weight": ["out.weight"]}
    assert model.out.weight is model.emb.weight
    assert torch.count_nonzero(model.proj.bias) == 0 and torch.count_nonzero(model.out.bias) == 0
    assert all(v != 1.0 for v in res.scales.values())
    assert_close(model.emb.weight.detach(), w_emb * res.scales["emb.weight"], rtol=1e-6, atol=0)
    assert_close(model.proj.weight.detach(), w_proj * res.scales["proj.weight"], rtol=1e-6, atol=0)


# --------------------------------------------------------------------------------------------
# 5. modes, BatchNorm state and dropout
# --------------------------------------------------------------------------------------------


class BNDropNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.9)
        self.bn2 = nn.BatchNorm1d(16, track_running_stats=False)
        self.lin2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.lin2(self.bn2(self.drop(torch.tanh(self.bn(self.lin1(x))))))


def _snapshot(model):
    return (
        {n: m.training for n, m in model.named_modules()},
        {n: m.track_running_stats for n, m in model.named_modules() if isinstance(m, nn.BatchNorm1d)},
        {n: b.detach().clone() for n, b in model.named_buffers()},
    )


@pytest.mark.parametrize("start", ["train", "eval", "mixed"])
def test_modes_and_batchnorm_state_restored_and_dropout_off(start):
    torch.manual_seed(0)
    model = BNDropNet().double().train()
    with torch.no_grad():  # non-default running statistics
        for x, _ in make_batches(2, bs=8):
            model(x)
    if start == "eval":
        model.eval()
    elif start == "mixed":
        model.bn.eval()
    before = _snapshot(model)
    assert before[2]["bn.num_batches_tracked"].item() == 2
    init = copy.deepcopy(model)
    seen = []

    def loss_fn(m, batch):
        seen.append((m.drop.training, m.bn.training, m.bn2.training, m.lin1.training, m.training,
                     m.bn.track_running_stats))
        return ce_loss(m, batch)

    batches = make_batches(8, bs=8)
    cfg = GradInitConfig(eta=0.05, gamma=30.0, lr=0.05, iters=6)
    torch.manual_seed(1)
    res1 = gradinit(model, batches, loss_fn, cfg)
    after = _snapshot(model)
    assert after[0] == before[0]
    assert after[1] == before[1]
    assert after[2].keys() == before[2].keys()
    for k in before[2]:
        assert torch.equal(after[2][k], before[2][k]), k
    # during GradInit: eval mode (no dropout) but BatchNorm on batch statistics, no running stats
    assert seen and all(s == (False, True, True, False, False, False) for s in seen)
    # dropout off: another run from the same init under a different RNG state is identical
    model2 = copy.deepcopy(init)
    torch.manual_seed(12345)
    res2 = gradinit(model2, batches, ce_loss, cfg)
    assert res1.scales == res2.scales
    assert res1.history == res2.history
    assert {r.branch for r in res1.history} <= {"objective", "constraint"}
    assert_params_equal(params_of(model), params_of(model2))


# --------------------------------------------------------------------------------------------
# 6. determinism
# --------------------------------------------------------------------------------------------


def test_deterministic_under_seed():
    def run():
        torch.manual_seed(0)
        model = FDNet().double()
        g = torch.Generator().manual_seed(5)
        batches = [token_batch(g, bs=6) for _ in range(6)]
        res = gradinit(model, batches, ce_loss, GradInitConfig(eta=0.01, gamma=13.0, lr=0.05, iters=6))
        return res, params_of(model)

    r1, p1 = run()
    r2, p2 = run()
    assert r1.scales == r2.scales
    assert r1.history == r2.history
    assert_params_equal(p1, p2)
    assert len({r.branch for r in r1.history}) == 2  # both branches exercised


# --------------------------------------------------------------------------------------------
# 7. non-finite losses and exceptions
# --------------------------------------------------------------------------------------------


def _with_nan(batch):
    x, y = batch
    x = x.clone()
    x[0, 0] = float("nan")
    return (x, y)


def test_nan_iterations_are_skipped():
    model = make_mlp()
    init = copy.deepcopy(model)
    pairs = make_pairs(6)
    bad = list(pairs)
    bad[2] = BatchPair(_with_nan(pairs[2].s), pairs[2].s_tilde)  # non-finite on S
    bad[4] = BatchPair(pairs[4].s, _with_nan(pairs[4].s_tilde))  # non-finite on S~ (objective)
    cfg = GradInitConfig(eta=0.05, gamma=1e3, lr=0.05, iters=6)
    with pytest.warns(RuntimeWarning, match="GradInit iteration"):
        res = gradinit(model, bad, ce_loss, cfg)
    branches = [r.branch for r in res.history]
    assert branches == ["objective", "objective", "skipped", "objective", "skipped", "objective"]
    assert res.num_skipped == 2 and res.history[2].reason and res.history[4].reason
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(math.isfinite(v) for v in res.scales.values())
    # skipped iterations leave scales and the Adam state untouched: same as never seeing them
    ref = gradinit(init, [pairs[i] for i in (0, 1, 3, 5)], ce_loss, cfg, iters=4)
    assert res.scales == ref.scales
    assert_params_equal(params_of(model), params_of(init))


def test_nan_every_time_raises_after_max_consecutive_skips():
    model = make_mlp()
    w0 = params_of(model)
    calls = []

    def loss_fn(m, batch):
        calls.append(1)
        return ce_loss(m, batch) * float("nan")

    cfg = GradInitConfig(eta=0.05, gamma=1e3, iters=10, max_consecutive_skips=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(FloatingPointError, match="3 consecutive"):
            gradinit(model, make_batches(5), loss_fn, cfg)
    assert len(calls) == 3
    assert_params_equal(params_of(model), w0)  # alpha = 1 -> W, exactly
    assert model.training


def test_exception_mid_run_leaves_the_weights_it_was_given():
    model = make_mlp().train()
    w0 = params_of(model)
    pairs = make_pairs(7)
    boom = BatchPair(pairs[6].s, (*pairs[6].s_tilde, "boom"))
    calls = []

    def loss_fn(m, batch):
        calls.append(len(batch))
        if len(batch) == 3:
            raise RuntimeError("boom")
        return ce_loss(m, batch)

    cfg = GradInitConfig(eta=0.05, gamma=1e3, lr=0.05, iters=7)
    with pytest.raises(RuntimeError, match="boom"):
        # raised on S~ of iteration 7, i.e. while the model holds alpha*W - eta*A[g]
        gradinit(model, pairs[:6] + [boom], loss_fn, cfg)
    assert calls[-1] == 3 and len(calls) == 14
    assert_params_equal(params_of(model), w0)  # not the 6 completed updates: exactly W
    assert all(m.training for m in model.modules())


# --------------------------------------------------------------------------------------------
# 8. configuration
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,kwargs", [
    ("optimizer", dict(optimizer="rmsprop")),
    ("eta", dict(eta=0)),
    ("eta", dict(eta=float("nan"))),
    ("eta", dict(eta=-1e-3)),
    ("gamma", dict(gamma=-1)),
    ("gamma", dict(gamma=float("inf"))),
    ("lr", dict(lr=0)),
    ("betas", dict(betas=(1.0, 0.9))),
    ("betas", dict(betas=(0.9,))),
    ("eps", dict(eps=0)),
    ("iters", dict(iters=-1)),
    ("iters", dict(iters=2.5)),
    ("min_scale", dict(min_scale=0)),
    ("max_scale", dict(max_scale=0.005)),
    ("max_scale", dict(min_scale=0.5, max_scale=0.4)),
    ("overlap", dict(overlap=1.5)),
    ("overlap", dict(overlap=-0.1)),
    ("scale_grad_clip", dict(scale_grad_clip=0)),
    ("sgd_step", dict(sgd_step="x")),
    ("reuse_graph", dict(reuse_graph="yes")),
    ("constraint_grad", dict(constraint_grad="fd")),
    ("adam_state", dict(adam_state="separate")),
    ("fd_eps", dict(fd_eps=0)),
    ("fd_eps", dict(fd_eps=1.0)),
    ("max_consecutive_skips", dict(max_consecutive_skips=0)),
    ("log_interval", dict(log_interval=0)),
    ("param_filter", dict(param_filter="all")),
])
def test_invalid_config_raises_naming_field(field, kwargs):
    with pytest.raises(ValueError, match=rf"GradInitConfig\.{field}="):
        GradInitConfig(**kwargs)
    # also through gradinit's keyword overrides, before any work is done
    model = make_mlp()
    w0 = params_of(model)
    with pytest.raises(ValueError, match=rf"GradInitConfig\.{field}="):
        gradinit(model, make_batches(3), ce_loss, GradInitConfig(), **kwargs)
    assert_params_equal(params_of(model), w0)


def test_gamma_rule_of_thumb():
    assert GradInitConfig(optimizer="adam", eta=1e-3).resolved_gamma == pytest.approx(100.0)
    assert GradInitConfig(optimizer="sgd", eta=0.1).resolved_gamma == pytest.approx(1.0)
    assert GradInitConfig(optimizer="sgd", eta=0.001).resolved_gamma == pytest.approx(math.sqrt(100.0))
    assert GradInitConfig(optimizer="ADAM", eta=0.5).resolved_gamma == pytest.approx(0.2)
    assert GradInitConfig(eta=1e-3, gamma=7.0).resolved_gamma == 7.0
    assert GradInitConfig(optimizer="adam").norm_p == 1 and GradInitConfig(optimizer="sgd").norm_p == 2
    assert GradInitConfig(optimizer="sgd", eta=0.1).to_dict()["resolved_gamma"] == pytest.approx(1.0)


# --------------------------------------------------------------------------------------------
# 9. overlapping_pairs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tuple", "dict"])
@pytest.mark.parametrize("overlap", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_overlapping_pairs(kind, overlap):
    n, bs = 4, 8
    ids = torch.arange(n * bs)
    raw = [(ids[i * bs:(i + 1) * bs], -ids[i * bs:(i + 1) * bs]) for i in range(n)]
    batches = raw if kind == "tuple" else [{"id": a, "neg": b, "meta": "x"} for a, b in raw]

    def get_ids(b):
        return b[0] if kind == "tuple" else b["id"]

    pairs = list(overlapping_pairs(batches, overlap))
    assert len(pairs) == (n if overlap == 1.0 else n - 1)
    for t, (s, st) in enumerate(pairs):
        assert type(s) is type(st) is type(batches[0])
        if kind == "dict":
            assert st.keys() == s.keys() and st["meta"] == "x"
            assert torch.equal(st["neg"], -st["id"])  # rows stay aligned across fields
        else:
            assert torch.equal(st[1], -st[0])
        si, sti = get_ids(s), get_ids(st)
        assert torch.equal(si, get_ids(batches[t]))
        assert len(si) == len(sti) == bs
        common = set(si.tolist()) & set(sti.tolist())
        assert len(common) == round(overlap * bs)
        if overlap < 1.0:
            nxt = set(get_ids(batches[t + 1]).tolist())
            assert set(sti.tolist()) - common <= nxt
            assert len(set(sti.tolist())) == bs  # no duplicates


def test_overlapping_pairs_edge_cases():
    assert list(overlapping_pairs([], 0.5)) == []
    assert list(overlapping_pairs([torch.zeros(4)], 0.5)) == []
    with pytest.raises(ValueError, match="overlap"):
        list(overlapping_pairs([torch.zeros(4)] * 3, 1.5))


# --------------------------------------------------------------------------------------------
# 10. constraint branch through real attention
# --------------------------------------------------------------------------------------------


def test_fused_cpu_attention_has_no_double_backward_and_math_attention_has_one():
    """Why the engine needs math_attention(): without it, second order fails on CPU."""
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    tokens = torch.randint(0, 20, (2, 6))
    params = list(model.parameters())

    def second_order():
        g = torch.autograd.grad(lm_loss(model, tokens), params, create_graph=True)
        return torch.autograd.grad(sum((x * x).sum() for x in g), params, allow_unused=True)

    with math_attention():
        assert any(h is not None and h.abs().sum() > 0 for h in second_order())
    try:
        second_order()
    except RuntimeError as e:
        assert "derivative for" in str(e) and "not implemented" in str(e), e
    else:
        pytest.skip("this PyTorch build has a double backward for the default CPU attention kernel")


def test_constraint_branch_through_transformer_attention(count_sdpa):
    torch.manual_seed(0)
    model = TinyTransformer().eval()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 20, (3, 6), generator=g) for _ in range(4)]
    w0 = params_of(model)
    res = gradinit(model, batches, lm_loss, GradInitConfig(eta=1e-3, gamma=1e-3, lr=0.01, iters=2))
    assert [r.branch for r in res.history] == ["constraint", "constraint"]
    assert count_sdpa  # the attention went through scaled_dot_product_attention
    assert all(math.isfinite(v) and v != 1.0 for v in res.scales.values())
    assert not model.training and not any(m.training for m in model.modules())
    assert any(not torch.equal(a, b) for a, b in zip(params_of(model), w0))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("gamma", [1e-3, 1e9])  # every iteration constraint / every iteration objective
def test_cuda_attention_matches_cpu(gamma):
    """On CUDA the fused attention kernels (flash / memory-efficient) have no double backward either."""
    torch.manual_seed(0)
    cpu_model = TinyTransformer().eval()
    cuda_model = TinyTransformer().cuda().eval()
    cuda_model.load_state_dict(cpu_model.state_dict())
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 20, (3, 6), generator=g) for _ in range(8)]
    cfg = GradInitConfig(eta=1e-3, gamma=gamma, lr=0.01, iters=4)
    ref = gradinit(cpu_model, batches, lm_loss, cfg)
    res = gradinit(cuda_model, [b.cuda() for b in batches], lm_loss, cfg)
    assert [r.branch for r in res.history] == [r.branch for r in ref.history]
    for name, v in ref.scales.items():
        assert res.scales[name] == pytest.approx(v, rel=1e-3, abs=1e-5), name
    for a, b in zip(params_of(cuda_model), params_of(cpu_model)):
        assert_close(a.cpu(), b, rtol=1e-3, atol=1e-5)


# --------------------------------------------------------------------------------------------
# 11. two-process gloo run
# --------------------------------------------------------------------------------------------

DIST_T = 8
DIST_GAMMA = 7.0


def _all_but_first_bias(name, param):
    return name != "0.bias"


def _dist_config(constraint_grad="exact"):
    # One tensor without a scale: the ranks must still end with rank 0's copy of it.
    return GradInitConfig(eta=0.01, gamma=DIST_GAMMA, lr=0.02, iters=DIST_T, constraint_grad=constraint_grad,
                          param_filter=_all_but_first_bias)


def _dist_model(seed):
    return make_mlp(seed=seed, dims=(5, 12, 3), weight_scale=2.0)


def _dist_pairs(rank):
    return make_pairs(DIST_T, seed=100 + rank, d_in=5, bs=6)


def _dist_worker(rank, world_size, port, out_dir, constraint_grad):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    try:
        # Different initial weights per rank: GradInit must broadcast rank 0's W.
        model = _dist_model(seed=rank)
        res = gradinit(model, _dist_pairs(rank), ce_loss, _dist_config(constraint_grad))
        torch.save({
            "scales": torch.tensor(list(res.scales.values()), dtype=torch.float64),
            "names": list(res.scales),
            "params": params_of(model),
            "history": [(r.branch, r.loss_s, r.grad_norm, r.loss_s_tilde) for r in res.history],
            "world_size": res.world_size,
        }, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# "fork" reuses the parent's imported torch (a spawned child re-imports it, which takes long on a
# loaded machine); the engine's CPU work in the parent is single-threaded, so forking is safe.
START_METHOD = os.environ.get("GRADINIT_TEST_START_METHOD", "fork" if os.name == "posix" else "spawn")


def _spawn_two_ranks(out_dir, constraint_grad="exact", deadline_s=300.0):
    import torch.multiprocessing as mp

    last = None
    for _attempt in range(3):
        port = _free_port()
        ctx = mp.start_processes(_dist_worker, args=(2, port, str(out_dir), constraint_grad), nprocs=2, join=False,
                                 start_method=START_METHOD)
        end = time.monotonic() + deadline_s
        try:
            while not ctx.join(timeout=2):
                if time.monotonic() > end:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    for p in ctx.processes:
                        p.join(10)
                        if p.is_alive():
                            p.kill()
                    pytest.fail(f"two-rank gloo run did not finish in {deadline_s:.0f}s")
            return
        except mp.ProcessRaisedException as e:  # retry only on a port clash
            last = e
            if "address already in use" not in str(e).lower() and "EADDRINUSE" not in str(e):
                raise
    raise last


@pytest.mark.parametrize("constraint_grad", ["exact", "finite_difference"])
def test_two_process_gloo_ranks_agree_and_average(tmp_path, constraint_grad):
    _spawn_two_ranks(tmp_path, constraint_grad)
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["names"] == r1["names"] and "0.bias" not in r0["names"]
    assert torch.equal(r0["scales"], r1["scales"])
    assert_params_equal(r0["params"], r1["params"])  # rank 1 started from other weights
    assert r0["history"] == r1["history"]
    branches = [h[0] for h in r0["history"]]
    assert "constraint" in branches and "objective" in branches

    # Equal-size shards and a mean loss: the rank-averaged run equals one process on the union.
    union = [BatchPair(*(tuple(torch.cat([a, b]) for a, b in zip(x0, x1))
                         for x0, x1 in zip(p0, p1)))
             for p0, p1 in zip(_dist_pairs(0), _dist_pairs(1))]
    m_union = _dist_model(seed=0)
    res_union = gradinit(m_union, union, ce_loss, _dist_config(constraint_grad))
    assert [r.branch for r in res_union.history] == branches
    s_union = torch.tensor(list(res_union.scales.values()), dtype=torch.float64)
    assert_close(r0["scales"], s_union, rtol=0, atol=1e-4)
    for h, r in zip(r0["history"], res_union.history):
        assert h[1] == pytest.approx(r.loss_s, rel=1e-6)  # recorded in float32
        assert h[2] == pytest.approx(r.grad_norm, rel=1e-5)

    # ... and differs from a run on rank 0's shard alone: the averaging matters.
    m_single = _dist_model(seed=0)
    res_single = gradinit(m_single, _dist_pairs(0), ce_loss, _dist_config(constraint_grad))
    s_single = torch.tensor(list(res_single.scales.values()), dtype=torch.float64)
    assert (s_single - r0["scales"]).abs().max() > 1e-3


# --------------------------------------------------------------------------------------------
# 12. apply_scales
# --------------------------------------------------------------------------------------------


def test_apply_scales_reproduces_gradinit_weights():
    torch.manual_seed(0)
    model = TiedLM().double()
    with torch.no_grad():
        model.out.bias.normal_()
    fresh = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 10, (4, 6), generator=g) for _ in range(6)]
    res = gradinit(model, batches, lm_loss, GradInitConfig(eta=0.05, gamma=1e3, lr=0.05, iters=5))
    applied = apply_scales(fresh, res.scales)
    assert sorted(applied) == sorted(res.scales)
    assert fresh.out.weight is fresh.emb.weight
    assert_params_equal(params_of(fresh), params_of(model))

    # an alias name works too, and a tied tensor is scaled once even if named twice
    other = copy.deepcopy(fresh)
    w = other.emb.weight.detach().clone()
    assert apply_scales(other, {"out.weight": 2.0, "emb.weight": 2.0}) == ["out.weight"]
    assert torch.equal(other.emb.weight.detach(), w * 2.0)

    with pytest.raises(ValueError, match="nope.weight"):
        apply_scales(copy.deepcopy(fresh), {"nope.weight": 1.5, "emb.weight": 2.0})
    lenient = copy.deepcopy(fresh)
    assert apply_scales(lenient, {"nope.weight": 1.5}, strict=False) == []
    assert_params_equal(params_of(lenient), params_of(fresh))
    with pytest.raises(ValueError, match="not finite"):
        apply_scales(copy.deepcopy(fresh), {"emb.weight": float("nan")})


# --------------------------------------------------------------------------------------------
# the scales' Adam: one set of moments, or one per branch
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("adam_state", ["shared", "per_branch"])
def test_scale_adam_moments_shared_or_per_branch(adam_state, monkeypatch):
    """Every scale update is Adam over the gradients of its own state's past steps: all iterations
    ("shared") or only those of the same branch ("per_branch", the authors' fairseq code)."""
    from fairseq_gradinit.core.optim import ScaleAdam

    calls = []
    step = ScaleAdam.step

    def recording(self, alpha, grad, ok):
        new, ok2 = step(self, alpha, grad, ok)
        calls.append((self, alpha.clone().double(), grad.clone().double(), new.clone().double()))
        return new, ok2

    monkeypatch.setattr(ScaleAdam, "step", recording)
    cfg = GradInitConfig(optimizer="adam", eta=0.05, gamma=14.0, lr=0.05, iters=12, adam_state=adam_state)
    res = gradinit(make_mlp(dims=(6, 16, 16, 3), weight_scale=2.0), make_pairs(12), ce_loss, cfg)
    branches = [r.branch for r in res.history]
    assert len(calls) == len(branches) and "skipped" not in branches
    # both branches, and a switch back to the constraint after objective steps
    assert "objective" in branches and "constraint" in branches[branches.index("objective"):]
    states = {b: {id(c[0]) for c, bb in zip(calls, branches) if bb == b} for b in ("constraint", "objective")}
    assert len(states["constraint"]) == len(states["objective"]) == 1
    assert (states["constraint"] == states["objective"]) == (adam_state == "shared")

    b1, b2 = cfg.betas
    moments = {}
    for state, alpha, grad, new in calls:
        m, v, t = moments.get(id(state), (0.0, 0.0, 0))
        m, v, t = b1 * m + (1 - b1) * grad, b2 * v + (1 - b2) * grad ** 2, t + 1
        moments[id(state)] = (m, v, t)
        expected = alpha - cfg.lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + cfg.eps)
        assert_close(new, expected.clamp(min=cfg.min_scale), rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------------------
# scale bookkeeping: one buffer for all W_i vs one op per tensor
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_flat_bookkeeping_matches_per_tensor_loop(optimizer, monkeypatch):
    """Models whose tensors share a dtype and device keep W in one buffer; the run is the same
    as with the per-tensor loop used otherwise."""
    cfg = GradInitConfig(optimizer=optimizer, eta=0.05, gamma=14.0 if optimizer == "adam" else 1.0,
                         lr=0.05, iters=8)
    flat = gradinit(make_mlp(dims=(6, 16, 16, 3), weight_scale=2.0), make_pairs(8), ce_loss, cfg)
    capture = ScaledParameters.capture

    def per_tensor(self):
        capture(self)
        assert self._flat is not None
        self._flat = None
        self.W = [w.clone() for w in self.W]
        self._rows = [w.reshape(-1) for w in self.W]

    monkeypatch.setattr(ScaledParameters, "capture", per_tensor)
    loop = gradinit(make_mlp(dims=(6, 16, 16, 3), weight_scale=2.0), make_pairs(8), ce_loss, cfg)
    assert [r.branch for r in flat.history] == [r.branch for r in loop.history]
    assert {r.branch for r in flat.history} == {"objective", "constraint"}
    for name in flat.scales:
        assert flat.scales[name] == pytest.approx(loop.scales[name], rel=1e-12, abs=1e-12)


class MixedPrecisionNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 16).double()
        self.b = nn.Linear(16, 3)  # float32

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)).float()).double()


def test_mixed_dtypes_use_per_tensor_bookkeeping():
    torch.manual_seed(0)
    model = MixedPrecisionNet()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    res = gradinit(model, make_pairs(4), ce_loss, GradInitConfig(eta=0.05, gamma=1.0, lr=0.05, iters=4))
    assert res.num_skipped == 0
    for n, p in model.named_parameters():
        assert p.dtype == before[n].dtype
        assert torch.allclose(p.detach(), before[n] * res.scales[n], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("p", [1, 2])
def test_per_tensor_norms_accumulate_in_float32(dtype, p):
    g = torch.Generator().manual_seed(0)
    ts = [(torch.randn(300, 40, generator=g) * 1e3).to(dtype), torch.randn(7, generator=g).to(dtype)]
    got = foreach_norm(ts, p)
    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert got.dtype == out_dtype and torch.isfinite(got).all()  # fp16 |g|_1 here exceeds 65504
    want = torch.stack([torch.linalg.vector_norm(t.double(), p) for t in ts]).to(out_dtype)
    assert torch.allclose(got, want, rtol=1e-5 if dtype != torch.float64 else 1e-12)


# --------------------------------------------------------------------------------------------
# fixed tensors: scaled, but out of g, ||g|| and the simulated step (multipliers kept as buffers)
# --------------------------------------------------------------------------------------------
class ScaledInput(nn.Module):
    """An MLP whose input is multiplied by ``m``, a 0-d tensor that training would not update."""

    def __init__(self):
        super().__init__()
        self.mlp = make_mlp(dims=(6, 16, 3), weight_scale=2.0)
        self.m = nn.Parameter(torch.tensor(1.7, dtype=torch.float64))

    def forward(self, x):
        return self.mlp(self.m * x)


def _is_m(name, p):
    return name == "m"


def test_fixed_tensors_get_a_scale_but_stay_out_of_g_and_the_step():
    model = ScaledInput()
    seen = []

    def loss_fn(m, batch):
        seen.append(float(m.m.detach()))
        return ce_loss(m, batch)

    pairs = make_pairs(1)
    res = gradinit(model, pairs, loss_fn, GradInitConfig(optimizer="adam", eta=0.01, gamma=1e9, lr=0.05, iters=1,
                                                         fixed_params=_is_m))
    assert "m" in res.scales and res.history[0].branch == "objective"
    # ||g||_1 of the first iteration is over every tensor but m
    fresh = ScaledInput()
    grads = torch.autograd.grad(ce_loss(fresh, pairs[0].s), list(fresh.parameters()))
    expected = sum(g.abs().sum() for (n, _), g in zip(fresh.named_parameters(), grads) if n != "m")
    assert abs(res.history[0].grad_norm - float(expected)) < 1e-9 * float(expected)
    # the simulated step moved the MLP's weights, not m: the S~ pass saw m at its initial value (alpha = 1)
    assert seen[0] == seen[1] == 1.7
    # without fixed_params, m moves in the simulated step (by eta*sign(g))
    seen.clear()
    gradinit(ScaledInput(), pairs, loss_fn, GradInitConfig(optimizer="adam", eta=0.01, gamma=1e9, lr=0.05, iters=1))
    assert abs(abs(seen[1] - seen[0]) - 0.01) < 1e-12


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_fixed_tensor_scale_gradients_are_exact(optimizer):
    """With a fixed tensor, the objective's scale gradient matches a finite difference of
    L(S~; alpha W - eta A[g]) / eta (A held constant, m not stepped), and the constraint's
    finite-difference gradient matches the double backward."""
    model = ScaledInput()
    s, s_tilde = make_batches(2)
    eta = 0.05
    cfg = GradInitConfig(optimizer=optimizer, eta=eta, gamma=1e-9, lr=1e-3, fixed_params=_is_m,
                         constraint_grad="finite_difference", fd_eps=1e-6)
    with gradinit_mode(model):
        engine = GradInit(model, ce_loss, cfg)
        params = engine.target.scaled.params
        g_all = gradients(ce_loss(model, s), params)
        grads = engine.target.scaled.without_fixed(g_all)
        gnorm = grad_norm(grads, engine.cfg.norm_p)
        exact = constraint_grad(engine.target, engine.state.alpha, s, grads, gnorm, engine.cfg).double()
        fd = constraint_grad_fd(engine.target, engine.state.alpha, s, grads, gnorm, engine.cfg, g_all).double()
        assert (fd - exact).norm() < 1e-4 * exact.norm()
        direction = [d.detach().clone() for d in step_direction([g.clone() for g in grads], gnorm, engine.cfg,
                                                                engine.state.gamma)]
        assert engine.target.scaled.fixed == [n == "m" for n in engine.target.scaled.names]
        assert float(direction[engine.target.scaled.names.index("m")].abs().sum()) == 0.0
        analytic, _ = objective_grad(engine.target, engine.state.alpha, s_tilde, direction, engine.cfg)
        W = [w.clone() for w in engine.target.scaled.W]

        def objective(alpha):
            with torch.no_grad():
                for p, w, a, d in zip(params, W, alpha, direction):
                    p.copy_(a * w - eta * d)
                return float(ce_loss(model, s_tilde)) / eta

        h = 1e-6
        for i, name in enumerate(engine.target.scaled.names):
            up, down = torch.ones(len(params), dtype=torch.float64), torch.ones(len(params), dtype=torch.float64)
            up[i] += h
            down[i] -= h
            numeric = (objective(up) - objective(down)) / (2 * h)
            assert abs(numeric - float(analytic[i])) < 1e-5 * max(1.0, abs(numeric)), name
        engine.finalize()


# --------------------------------------------------------------------------------------------
# the step as a function: gradinit_step on a ScaledModel and a GradInitState
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    dict(optimizer="adam", adam_state="shared"),
    dict(optimizer="adam", adam_state="per_branch", max_scale=1.5),
    dict(optimizer="sgd", sgd_step="normalized", eta=0.02, gamma=None, gamma_init_factor=0.95,
         constraint_grad="finite_difference"),
    dict(optimizer="adam", gamma=None, gamma_init_factor=0.9, lookahead_steps=2, reuse_graph=False),
])
def test_gradinit_step_called_directly_equals_the_class(options):
    """The function alone, on state built by hand from the public pieces, gives bit-identical scales,
    moments, branches and losses to the GradInit class and to gradinit(); each step hands back the
    previous step's L(S~), read in its one host sync."""
    from fairseq_gradinit.core import GradInitState, ScaledModel, gradinit_step

    cfg = GradInitConfig(**{**dict(optimizer="adam", eta=0.05, gamma=14.0, lr=0.05, iters=10), **options})
    pairs = make_pairs(10)
    model = make_mlp(dims=(6, 16, 16, 3), weight_scale=2.0)

    held = copy.deepcopy(model)
    engine = GradInit(held, ce_loss, cfg)
    with gradinit_mode(held):
        records = [engine.step(p) for p in pairs]
    engine.finalize()

    direct = copy.deepcopy(model)
    scaled = ScaledParameters(direct, cfg.param_filter, bounds=cfg.scale_bounds, min_scale=cfg.min_scale,
                              max_scale=cfg.max_scale)
    scaled.capture()
    target, state = ScaledModel(direct, ce_loss, scaled), GradInitState.initial(scaled, cfg)
    with gradinit_mode(direct):
        results = [gradinit_step(target, state, p, cfg) for p in pairs]
    scaled.write(state.alpha)

    branches = [r.branch for r in results]
    assert "skipped" not in branches and len(set(branches)) == 2, branches  # both branches ran
    assert branches == [r.branch for r in records]
    assert [(r.loss_s, r.grad_norm) for r in results] == [(r.loss_s, r.grad_norm) for r in records]
    assert torch.equal(state.alpha, engine.state.alpha) and not torch.equal(state.alpha, torch.ones_like(state.alpha))
    for mine, theirs in ((state.adam, engine.state.adam), (state.adam_constraint, engine.state.adam_constraint)):
        assert torch.equal(mine.m, theirs.m) and torch.equal(mine.v, theirs.v)
    assert (state.adam is state.adam_constraint) == (cfg.adam_state == "shared")
    assert state.gamma == engine.state.gamma and state.last_branch == branches[-1]
    assert_params_equal(params_of(direct), params_of(held))
    # the previous step's S~ loss (0 after a constraint step) and its ok flag
    assert results[0].previous is None
    assert [r.previous for r in results[1:]] == [(r.loss_s_tilde or 0.0, 1.0) for r in records[:-1]]
    assert gradinit(copy.deepcopy(model), pairs, ce_loss, cfg).scales == scaled.scales_dict()
