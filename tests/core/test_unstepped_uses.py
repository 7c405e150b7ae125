"""Uses of a tied tensor that keep alpha*W in the simulated step (the authors' output projection)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import GradInit, GradInitConfig, gradinit, gradinit_mode
from fairseq_gradinit.core.engine import grad_norm, objective_grad, step_direction
from fairseq_gradinit.core.runtime import gradients
from tiny_models import central_differences

V, D = 13, 6


class TiedLM(nn.Module):
    """Input embedding tied to the output projection, as fairseq's --share-decoder-input-output-embed."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.lin = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)
        self.output_projection = nn.Linear(D, V, bias=False)
        self.output_projection.weight = self.embed.weight

    def forward(self, x):
        return self.output_projection(self.norm(torch.tanh(self.lin(self.embed(x)))))


def lm_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))


def reference_objective(model, names, W, alpha, direction, eta, batch):
    """L(S~) / eta written out by hand: the embedding use steps, the output projection does not."""
    th = {n: alpha[i] * W[i] - eta * direction[i] for i, n in enumerate(names)}
    emb_plain = alpha[names.index("embed.weight")] * W[names.index("embed.weight")]
    x, y = batch
    h = torch.tanh(F.linear(F.embedding(x, th["embed.weight"]), th["lin.weight"], th["lin.bias"]))
    h = F.layer_norm(h, (D,), th["norm.weight"], th["norm.bias"])
    return F.cross_entropy(F.linear(h, emb_plain).reshape(-1, V), y.reshape(-1)) / eta


def batch(g):
    return torch.randint(0, V, (4, 7), generator=g), torch.randint(0, V, (4, 7), generator=g)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_objective_scale_gradient_with_an_unstepped_tied_use_matches_finite_differences(optimizer):
    torch.manual_seed(0)
    model = TiedLM().double()
    with torch.no_grad():
        model.norm.bias.add_(0.3 * torch.randn(D, dtype=torch.float64))
        model.lin.bias.add_(0.3 * torch.randn(D, dtype=torch.float64))
    g = torch.Generator().manual_seed(1)
    s, s_tilde = batch(g), batch(g)
    eta = 0.05
    cfg = GradInitConfig(optimizer=optimizer, eta=eta, gamma=1e9, iters=1, unstepped_uses=r"^output_projection\.")
    engine = GradInit(model, lm_loss, cfg)
    sc = engine.target.scaled
    assert engine.target.unstepped.names == ["output_projection.weight"]
    assert engine.target.unstepped.whole == [] and len(engine.target.unstepped.partial) == 1
    engine.state.alpha.copy_(torch.empty_like(engine.state.alpha).uniform_(0.6, 1.4))
    base = engine.state.alpha.clone()
    with gradinit_mode(model):
        sc.write(engine.state.alpha)
        grads = gradients(lm_loss(model, s), sc.params)
        gnorm = grad_norm(grads, engine.cfg.norm_p)
        direction = [d.detach().clone()
                     for d in step_direction([x.clone() for x in grads], gnorm, engine.cfg, engine.state.gamma)]
        analytic, loss = objective_grad(engine.target, engine.state.alpha, s_tilde, [d.clone() for d in direction],
                                        engine.cfg)
        # the module is tied again afterwards
        assert model.output_projection.weight is model.embed.weight
        W = [w.clone() for w in sc.W]
        f = lambda a: reference_objective(model, sc.names, W, a, direction, eta, s_tilde).item()  # noqa: E731
        assert loss.item() / eta == pytest.approx(f(base), rel=1e-10)
        fd = central_differences(f, base)
    torch.testing.assert_close(analytic, fd, rtol=1e-6, atol=1e-8)
    # and it differs from the step that moves every use
    engine_all = GradInit(model, lm_loss, GradInitConfig(optimizer=optimizer, eta=eta, gamma=1e9, iters=1))
    engine_all.state.alpha.copy_(base)
    with gradinit_mode(model):
        all_uses, _ = objective_grad(engine_all.target, engine_all.state.alpha, s_tilde, [d.clone() for d in direction],
                                     engine_all.cfg)
    assert not torch.allclose(all_uses, analytic, rtol=1e-3)


def test_a_tensor_whose_every_use_is_unstepped_takes_no_step_and_a_pattern_matching_nothing_is_refused():
    torch.manual_seed(0)
    model = TiedLM().double()
    engine = GradInit(model, lm_loss, GradInitConfig(eta=0.05, gamma=1e9, iters=1, unstepped_uses=r"^lin\.weight$"))
    i = engine.target.scaled.names.index("lin.weight")
    assert engine.target.unstepped.whole == [i] and engine.target.unstepped.partial == []
    direction = [torch.ones_like(p) for p in engine.target.scaled.params]
    engine.target.unstepped.drop_steps(direction)
    assert direction[i].abs().sum() == 0 and all(d.abs().sum() > 0 for k, d in enumerate(direction) if k != i)
    with pytest.raises(ValueError, match="matches no use"):
        GradInit(model, lm_loss, GradInitConfig(eta=0.05, iters=1, unstepped_uses=r"^decoder\."))
    with pytest.raises(ValueError, match="unstepped_uses"):
        GradInitConfig(unstepped_uses="(")


def test_gradinit_with_unstepped_uses_runs_and_leaves_the_model_tied():
    torch.manual_seed(0)
    model = TiedLM()
    g = torch.Generator().manual_seed(2)
    data = [batch(g) for _ in range(4)]
    res = gradinit(model, data, lm_loss, GradInitConfig(eta=0.05, gamma=1e9, iters=6, lr=0.05,
                                                        unstepped_uses=r"output_projection"))
    assert res.num_objective == 6
    assert model.output_projection.weight is model.embed.weight
    assert all(torch.isfinite(torch.tensor(v)) for v in res.scales.values())
    assert res.config.to_dict()["unstepped_uses"] == "output_projection"


def test_the_authors_pattern_unties_exactly_the_output_projection_of_a_fairseq_transformer(tmp_path):
    pytest.importorskip("fairseq")
    from fairseq_helpers import make_tiny_bin
    from fairseq_train import TINY_MODEL, fresh_model

    from fairseq_gradinit.core.uses import UnsteppedUses

    data = make_tiny_bin(tmp_path, {"train": 30, "valid": 5, "test": 5}, 200)
    model = fresh_model([str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3"])
    params = list(model.parameters())
    uses = UnsteppedUses(model, params, r"decoder\.output_projection\.")
    assert uses.names == ["decoder.output_projection.weight"] and uses.whole == []
    (i, mod, attr), = uses.partial
    assert mod is model.decoder.output_projection and params[i] is model.encoder.embed_tokens.weight
