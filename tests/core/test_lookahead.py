"""``lookahead_steps``: the objective after K simulated Adam steps, checked against torch.optim.Adam's own
steps and against central differences of the objective with the steps held constant."""
import pytest
import torch

from fairseq_gradinit.core import GradInitConfig
from fairseq_gradinit.core.batching import BatchPair
from fairseq_gradinit.core import engine as engine_module
from fairseq_gradinit.core.engine import GradInit

from tiny_models import TinyTransformer, central_differences, lm_loss, token_batches


def _engine(k, **kw):
    torch.manual_seed(0)
    model = TinyTransformer().double().eval()
    cfg = GradInitConfig(optimizer="adam", eta=1e-2, gamma=1e9, iters=1, lookahead_steps=k, **kw)
    return model, GradInit(model, lm_loss, cfg)


def _captured_direction(engine, pair, monkeypatch):
    seen = {}
    real = engine_module.objective_grad  # what gradinit_step calls

    def spy(target, alpha, s_tilde, direction, config):
        seen["direction"] = [d.clone() for d in direction]
        seen["theta_start"] = [w * a for w, a in zip(engine.target.scaled.W, engine.state.alpha.unbind())]
        return real(target, alpha, s_tilde, direction, config)

    monkeypatch.setattr(engine_module, "objective_grad", spy)
    engine.step(pair)
    return seen


@pytest.mark.parametrize("k", [2, 3])
def test_simulated_steps_are_torch_adams_steps(k, monkeypatch):
    """alpha W - eta (u_1 + ... + u_K) is where torch.optim.Adam takes the same weights in K steps on S."""
    s, s_tilde = token_batches(2)
    model, engine = _engine(k, lookahead_betas=(0.9, 0.98))
    seen = _captured_direction(engine, BatchPair(s, s_tilde), monkeypatch)
    twin = TinyTransformer().double().eval()
    with torch.no_grad():
        for p, theta in zip(twin.parameters(), seen["theta_start"]):
            p.copy_(theta)
    opt = torch.optim.Adam(twin.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
    for _ in range(k):
        opt.zero_grad()
        lm_loss(twin, s).backward()
        opt.step()
    for p, theta, d in zip(twin.parameters(), seen["theta_start"], seen["direction"]):
        # float64; after K >= 2 steps the gradients' sums round by thread count (~1e-12 on 2 threads), far below
        # an Adam step of 1e-2
        torch.testing.assert_close(p.detach(), theta - 1e-2 * d, rtol=0, atol=1e-11)


def test_objective_gradient_matches_central_differences(monkeypatch):
    """d/dalpha of L(S~; alpha W - eta U) / eta with the K=2 steps U held constant."""
    s, s_tilde = token_batches(2)
    model, engine = _engine(2)
    captured = {}
    real = engine_module.objective_grad  # what gradinit_step calls

    def spy(target, alpha, st, direction, config):
        captured["direction"] = [d.clone() for d in direction]
        captured["alpha"] = engine.state.alpha.detach().clone()
        grad, loss = real(target, alpha, st, direction, config)
        captured["grad"] = grad.detach().clone()
        return grad, loss

    monkeypatch.setattr(engine_module, "objective_grad", spy)
    engine.step(BatchPair(s, s_tilde))
    U = captured["direction"]

    def objective(alpha):
        with torch.no_grad():
            for p, w, a, u in zip(engine.target.scaled.params, engine.target.scaled.W, alpha.unbind(), U):
                p.copy_(a * w - 1e-2 * u)
            return float(lm_loss(model, s_tilde)) / 1e-2

    fd = central_differences(objective, captured["alpha"])
    torch.testing.assert_close(captured["grad"], fd, rtol=1e-5, atol=1e-6)


def test_one_step_is_the_papers_objective():
    """lookahead_steps=1 is the default path: the same scales bit for bit."""
    batches = token_batches(6)
    out = []
    for extra in ({}, {"lookahead_steps": 1}):
        torch.manual_seed(0)
        model = TinyTransformer().eval()
        from fairseq_gradinit.core import gradinit

        res = gradinit(model, batches, lm_loss, GradInitConfig(optimizer="adam", eta=1e-2, gamma=1e9, iters=3,
                                                                **extra))
        out.append(res.scales)
    assert out[0] == out[1]


@pytest.mark.parametrize("kw, field", [
    ({"lookahead_steps": 0}, "lookahead_steps"),
    ({"lookahead_steps": 2.0}, "lookahead_steps"),
    ({"lookahead_steps": 2, "optimizer": "sgd", "eta": 0.1}, "lookahead_steps"),
    ({"lookahead_steps": 2, "unstepped_uses": "out"}, "lookahead_steps"),
    ({"lookahead_betas": (0.9, 1.0)}, "lookahead_betas"),
])
def test_invalid_lookahead_settings_are_refused(kw, field):
    base = {"optimizer": "adam", "eta": 1e-3}
    with pytest.raises(ValueError, match=field):
        GradInitConfig(**{**base, **kw})
