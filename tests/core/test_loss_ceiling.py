"""``loss_ceiling``: an iteration whose L(S; alpha W) lies more than the ceiling above L(S) at the init steps the
scales down L(S) (checked against central differences), a bound that never binds changes nothing, and the
reference survives a resume."""
import pytest
import torch

from fairseq_gradinit.core import GradInitConfig, gradinit
from fairseq_gradinit.core.batching import BatchPair
from fairseq_gradinit.core.engine import GradInit

from tiny_models import TinyTransformer, central_differences, lm_loss, token_batches


def _engine(**kw):
    torch.manual_seed(0)
    model = TinyTransformer().double().eval()
    cfg = GradInitConfig(optimizer="adam", eta=1e-2, gamma=1e9, iters=2, adam_state="per_branch", **kw)
    return model, GradInit(model, lm_loss, cfg)


def test_first_iteration_measures_the_reference():
    s, s_tilde = token_batches(2)
    model, engine = _engine(loss_ceiling=0.0)
    rec = engine.step(BatchPair(s, s_tilde))
    assert rec.branch == "objective"  # L(S) equals the reference it measures: not above it
    assert engine.state.loss_ref == rec.loss_s


def test_a_ceiling_step_descends_the_loss_on_s(monkeypatch):
    """Above the bound the scales take one Adam step (per_branch: the constraint's moments) on dL(S)/dalpha,
    which central differences of L(S; alpha W) confirm; the objective's moments are left alone."""
    batches = token_batches(4)
    model, engine = _engine(loss_ceiling=0.0)
    engine.step(BatchPair(batches[0], batches[1]))
    engine.state.loss_ref = -1.0  # every later L(S) is above the bound
    seen = {}
    adam_c, adam_o = engine.state.adam_constraint, engine.state.adam
    real_step = type(adam_c).step

    def spy(self, alpha, grad, ok):
        seen.setdefault(id(self), []).append(grad.detach().clone())
        return real_step(self, alpha, grad, ok)

    monkeypatch.setattr(type(adam_c), "step", spy)
    alpha = engine.state.alpha.detach().clone()
    engine._flush_pending()
    rec = engine.step(BatchPair(batches[2], batches[3]))
    assert rec.branch == "ceiling"
    assert list(seen) == [id(adam_c)] and id(adam_o) != id(adam_c)

    scaled = engine.target.scaled

    def loss_at(a):
        with torch.no_grad():
            for p, w, ai in zip(scaled.params, scaled.W, a.unbind()):
                p.copy_(ai * w)
            return float(lm_loss(model, batches[2]))

    fd = central_differences(loss_at, alpha)
    torch.testing.assert_close(seen[id(adam_c)][0], fd, rtol=1e-5, atol=1e-7)
    # Adam's first step moves each scale by tau against the sign of its gradient (where that gradient is not ~0)
    moved = engine.state.alpha.detach() - alpha
    big = fd.abs() > 1e-6
    assert bool(big.any())
    assert torch.equal(torch.sign(moved[big]), -torch.sign(fd[big]))


def test_a_bound_that_never_binds_changes_nothing():
    batches = token_batches(8)
    out = []
    for extra in ({}, {"loss_ceiling": 1e6}):
        torch.manual_seed(0)
        model = TinyTransformer().eval()
        res = gradinit(model, batches, lm_loss, GradInitConfig(optimizer="adam", eta=1e-2, gamma=1e9, iters=5,
                                                                **extra))
        out.append(res)
    assert out[0].scales == out[1].scales
    assert out[1].num_ceiling == 0 and out[1].to_dict()["num_ceiling"] == 0
    assert "num_ceiling" not in out[0].to_dict()  # gradinit.json of runs without the bound keeps its keys


def test_the_reference_survives_a_resume():
    batches = token_batches(4)
    model, engine = _engine(loss_ceiling=0.5)
    engine.step(BatchPair(batches[0], batches[1]))
    state = engine.state_dict()
    assert state["loss_ref"] == engine.state.loss_ref
    _, again = _engine(loss_ceiling=0.5)
    again.load_state_dict(state)
    assert again.state.loss_ref == engine.state.loss_ref
    _, other = _engine(loss_ceiling=0.25)
    with pytest.raises(ValueError, match="loss_ceiling"):
        other.load_state_dict(state)


@pytest.mark.parametrize("value", [-0.1, float("inf"), float("nan"), True, "0.5"])
def test_invalid_ceilings_are_refused(value):
    with pytest.raises(ValueError, match="loss_ceiling"):
        GradInitConfig(optimizer="adam", eta=1e-3, loss_ceiling=value)
