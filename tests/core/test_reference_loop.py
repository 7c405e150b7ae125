"""GradInit against an independently written, literal loop of Algorithm 1 on a small Post-LN
Transformer in float64.

The reference differentiates with respect to the scales themselves: parameters are substituted
by alpha_i * W_i (and alpha_i * W_i - eta * sign(g_i) for the objective) through
``torch.func.functional_call``, as the authors' fairseq code substitutes module parameters, and
the scales follow Adam with separate moments per branch. The engine instead works in place on
the model's parameters and reduces dL/dtheta_i to <dL/dtheta_i, W_i>.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fairseq_gradinit.core import BatchPair, GradInitConfig, ScaleBound, gradinit

VOCAB, D, FFN, HEADS, LEN = 11, 8, 16, 2, 5


class PostLNLayer(nn.Module):
    """x <- LN(x + Attn(x)); x <- LN(x + FFN(x)), as the original Transformer (dropout off)."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(D, D) for _ in range(4))
        self.attn_layer_norm = nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, FFN), nn.Linear(FFN, D)
        self.final_layer_norm = nn.LayerNorm(D)
        for m in (self.out_proj, self.fc2):  # fairseq zero-initializes these biases
            nn.init.zeros_(m.bias)

    def forward(self, x):
        b, t, _ = x.shape
        heads = lambda y: y.view(b, t, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // HEADS), dim=-1) @ v
        x = self.attn_layer_norm(x + self.out_proj(att.transpose(1, 2).reshape(b, t, D)))
        return self.final_layer_norm(x + self.fc2(torch.relu(self.fc1(x))))


class TinyPostLN(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList([PostLNLayer(), PostLNLayer()])
        self.out = nn.Linear(D, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) * math.sqrt(D)
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def lm_loss(model, batch):
    tokens, target = batch
    return F.cross_entropy(model(tokens).reshape(-1, VOCAB), target.reshape(-1))


def make_pairs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = lambda: (torch.randint(VOCAB, (4, LEN), generator=g), torch.randint(VOCAB, (4, LEN), generator=g))  # noqa: E731
    pairs = []
    for _ in range(n):
        a, b, c = batch(), batch(), batch()
        cat = lambda x, y: tuple(torch.cat([u, w]) for u, w in zip(x, y))  # noqa: E731
        pairs.append(BatchPair(cat(a, b), cat(b, c)))  # S~ shares half of S
    return pairs


def reference_gradinit(model, pairs, *, eta, gamma, tau, betas, eps, bounds):
    """Algorithm 1, literally: ``bounds(name, param) -> (min, max)`` or None for no scale."""
    named = dict(model.named_parameters())
    W = {n: p.detach().clone() for n, p in named.items()}
    alpha = {n: torch.ones((), dtype=torch.float64, requires_grad=True)
             for n, p in named.items() if bounds(n, p) is not None}
    state = {branch: {n: [0.0, 0.0, 0] for n in alpha} for branch in ("constraint", "objective")}
    branches = []
    for s, s_tilde in pairs:
        theta = {n: alpha[n] * W[n] if n in alpha else W[n].requires_grad_() for n in W}
        loss = lm_loss(lambda x: functional_call(model, theta, (x,)), s)
        g = torch.autograd.grad(loss, list(theta.values()), create_graph=True)
        gnorm = sum(gi.abs().sum() for gi in g)
        if gnorm.item() > gamma:
            branch, target = "constraint", gnorm
        else:
            branch = "objective"
            stepped = {n: t - eta * gi.sign().detach() for (n, t), gi in zip(theta.items(), g)}
            target = lm_loss(lambda x: functional_call(model, stepped, (x,)), s_tilde) / eta
        grads = torch.autograd.grad(target, list(alpha.values()))
        branches.append(branch)
        with torch.no_grad():
            for (n, a), ga in zip(alpha.items(), grads):
                m, v, t = state[branch][n]
                m, v, t = betas[0] * m + (1 - betas[0]) * ga, betas[1] * v + (1 - betas[1]) * ga * ga, t + 1
                state[branch][n] = [m, v, t]
                step = tau * (m / (1 - betas[0] ** t)) / (torch.sqrt(v / (1 - betas[1] ** t)) + eps)
                lo, hi = bounds(n, named[n])
                a.copy_((a - step).clamp(min=lo, max=hi))
    return {n: a.item() for n, a in alpha.items()}, branches


def authors_bounds(n, p):
    """Authors' groups: every tensor moves; non-zero ones get a scale; biases may reach 0,
    LayerNorm weights are capped (at 1.05 here, so that the cap is hit in 30 iterations)."""
    if not torch.count_nonzero(p):
        return None
    if n.endswith(".bias"):
        return (0.0, math.inf)
    if "layer_norm" in n:
        return (0.01, 1.05)
    return (0.01, math.inf)


def test_engine_matches_literal_algorithm_1_float64():
    torch.manual_seed(0)
    model = TinyPostLN().double()
    with torch.no_grad():  # large weights: the gradient norm starts above gamma
        for n, p in model.named_parameters():
            if n.endswith(".weight") and "layer_norm" not in n:
                p.mul_(2.0)
    pairs = make_pairs(30)
    ref_model = TinyPostLN().double()
    ref_model.load_state_dict(model.state_dict())
    g0 = torch.autograd.grad(lm_loss(model, pairs[0].s), list(model.parameters()))
    gamma = 0.5 * sum(g.abs().sum() for g in g0).item()
    cfg = GradInitConfig(optimizer="adam", eta=0.05, gamma=gamma, lr=0.02, betas=(0.9, 0.98), iters=30,
                         adam_state="per_branch", step_params="all",
                         scale_bounds=[("bias", 0.0, None), ("norm", None, 1.05)])
    res = gradinit(model, pairs, lm_loss, cfg)
    want, branches = reference_gradinit(ref_model, pairs, eta=cfg.eta, gamma=gamma, tau=cfg.lr, betas=cfg.betas,
                                        eps=cfg.eps, bounds=authors_bounds)

    assert [r.branch for r in res.history] == branches
    assert branches.count("constraint") >= 3 and branches.count("objective") >= 3
    assert set(res.scales) == set(want)
    # all-zero tensors (out_proj/fc2/LayerNorm biases) moved in the step but got no scale
    assert not any(n.endswith(("out_proj.bias", "fc2.bias", "layer_norm.bias")) for n in want)
    for n in want:
        assert res.scales[n] == pytest.approx(want[n], abs=1e-5), n
    assert max(v for n, v in want.items() if "layer_norm" in n) == pytest.approx(1.05)  # the cap binds
    assert any(v != pytest.approx(1.0, abs=1e-3) for n, v in want.items() if n.endswith(".bias"))


def test_step_params_scaled_leaves_zero_tensors_out_of_the_step():
    """step_params='scaled' (the old behaviour) differs from 'all' exactly by the all-zero
    tensors, and 'all' equals scaling every tensor (an all-zero tensor's scale has gradient 0)."""
    pairs = make_pairs(8)
    runs = {}
    for key, kw in {"all": dict(step_params="all"), "scaled": dict(step_params="scaled"),
                    "filter_all": dict(step_params="scaled", param_filter=lambda n, p: True)}.items():
        torch.manual_seed(0)
        model = TinyPostLN().double()
        runs[key] = gradinit(model, pairs, lm_loss, GradInitConfig(eta=0.05, gamma=1e9, lr=0.02, iters=8, **kw))
    assert set(runs["all"].scales) == set(runs["scaled"].scales)
    assert all(runs["filter_all"].scales[n] == 1.0 for n in runs["filter_all"].scales if n not in runs["all"].scales)
    for n, v in runs["all"].scales.items():
        assert runs["filter_all"].scales[n] == pytest.approx(v, abs=1e-12)
    assert max(abs(runs["all"].scales[n] - runs["scaled"].scales[n]) for n in runs["all"].scales) > 1e-6


def test_scale_bounds_select_and_validate():
    torch.manual_seed(0)
    model = TinyPostLN().double()
    cfg = GradInitConfig(eta=0.05, gamma=1e9, lr=0.5, iters=6, min_scale=0.9, max_scale=1.1,
                         scale_bounds=[ScaleBound("re:layers\\.0\\.fc1\\.weight$", 0.5, 3.0), ("bias", 0.0, None),
                                       ("norm", 0.2, 1.0)])
    res = gradinit(model, make_pairs(6), lm_loss, cfg)
    for n, v in res.scales.items():
        lo, hi = (0.5, 3.0) if n == "layers.0.fc1.weight" else (0.0, 1.1) if n.endswith(".bias") else \
            (0.2, 1.0) if "layer_norm" in n else (0.9, 1.1)
        assert lo - 1e-12 <= v <= hi + 1e-12, (n, v)
    assert res.to_dict()["config"]["scale_bounds"] == [["re:layers\\.0\\.fc1\\.weight$", 0.5, 3.0],
                                                       ["bias", 0.0, None], ["norm", 0.2, 1.0]]
    # the scales' learning rate is written as tau, so that no one takes it for the training lr
    assert res.to_dict()["config"]["tau"] == 0.5 and "lr" not in res.to_dict()["config"]
    for bad, msg in [([("weights", 0, 1)], "expected one of"), ([("bias", -1, None)], "min_scale"),
                     ([("bias", 2, 1)], "below min_scale"), ([("re:(", 0, 1)], "regular expression"),
                     (("bias", 0, None), "scale bound"), ("bias", "scale_bounds")]:
        with pytest.raises(ValueError, match=msg):
            GradInitConfig(scale_bounds=bad)
    # a side left at None takes the global bound, which must not empty the group's range
    for kw in [dict(scale_bounds=[("norm", None, 0.005)]), dict(max_scale=2.0, scale_bounds=[("bias", 3.0, None)])]:
        with pytest.raises(ValueError, match="scale_bounds=.* give it both bounds"):
            GradInitConfig(**kw)
    assert GradInitConfig(scale_bounds=[("norm", 0.001, 0.005)]).scale_bounds[0].max_scale == 0.005
    with pytest.raises(ValueError, match="step_params"):
        GradInitConfig(step_params="some")
