"""The scales' Adam as state plus a pure step function: the step is Adam with a clipped gradient and clamped
result, checked against a hand-written reference in plain Python floats; it leaves its input state untouched; a
masked or non-finite step changes nothing; the state saves and restores."""

import math

import pytest
import torch

from fairseq_gradinit.core import ScaleAdam, ScaleAdamState, scale_adam_step

LR, BETAS, EPS = 0.05, (0.9, 0.999), 1e-8
GRADS = [[0.3, -2.0, 0.01, 5.0], [-0.1, 1.5, 0.02, 4.0], [0.7, -0.4, -0.03, -6.0], [0.2, 0.2, 0.2, 0.2]]
ALPHA = [1.0, 0.5, 2.0, 0.05]
LO, HI = [0.1, 0.1, 0.1, 0.04], 1.9


def reference_adam(alpha, grads, *, clip):
    """Adam over ``grads`` (lists of floats) from zero moments, each gradient clipped to norm ``clip`` and each
    result clamped to ``[LO, HI]``; the scales after every step."""
    b1, b2 = BETAS
    m, v, out = [0.0] * len(alpha), [0.0] * len(alpha), []
    for t, g in enumerate(grads, 1):
        norm = math.sqrt(sum(x * x for x in g))
        factor = min(1.0, clip / (norm + 1e-12)) if clip is not None else 1.0
        g = [x * factor for x in g]
        m = [b1 * mi + (1 - b1) * gi for mi, gi in zip(m, g)]
        v = [b2 * vi + (1 - b2) * gi * gi for vi, gi in zip(v, g)]
        alpha = [a - LR * (mi / (1 - b1**t)) / (math.sqrt(vi / (1 - b2**t)) + EPS) for a, mi, vi in zip(alpha, m, v)]
        alpha = [min(max(a, lo), HI) for a, lo in zip(alpha, LO)]
        out.append(alpha)
    return out


def step(alpha, grad, state, *, clip, ok=True):
    return scale_adam_step(
        alpha,
        grad,
        state,
        lr=LR,
        betas=BETAS,
        eps=EPS,
        clip=clip,
        min_scale=torch.tensor(LO, dtype=torch.float64),
        max_scale=HI,
        ok=torch.tensor(ok),
    )


@pytest.mark.parametrize("clip", [None, 1.0])
def test_the_step_is_adam_with_clipped_gradients_and_clamped_scales(clip):
    expected = reference_adam(ALPHA, GRADS, clip=clip)
    alpha = torch.tensor(ALPHA, dtype=torch.float64)
    state = ScaleAdamState.zeros_like(alpha)
    clamped = 0
    for t, (grad, want) in enumerate(zip(GRADS, expected), 1):
        alpha, ok, state = step(alpha, torch.tensor(grad, dtype=torch.float64), state, clip=clip)
        assert bool(ok) and int(state.step_count) == t
        torch.testing.assert_close(alpha, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-15)
        clamped += sum(w in (HI, lo) for w, lo in zip(want, LO))
    assert clamped > 0  # the bounds were reached, so the clamp is checked too


def test_the_step_leaves_its_input_state_unchanged():
    alpha = torch.tensor(ALPHA, dtype=torch.float64)
    state = ScaleAdamState.zeros_like(alpha)
    _, _, state = step(alpha, torch.tensor(GRADS[0], dtype=torch.float64), state, clip=None)
    before = {k: t.clone() for k, t in state.state_dict().items()}
    _, _, after = step(alpha, torch.tensor(GRADS[1], dtype=torch.float64), state, clip=None)
    assert all(torch.equal(before[k], t) for k, t in state.state_dict().items())
    assert int(after.step_count) == 2 and not torch.equal(after.m, state.m)


@pytest.mark.parametrize("case", ["masked", "nan", "inf"])
def test_a_masked_or_non_finite_step_changes_nothing(case):
    alpha = torch.tensor(ALPHA, dtype=torch.float64)
    _, _, state = step(alpha, torch.tensor(GRADS[0], dtype=torch.float64), ScaleAdamState.zeros_like(alpha), clip=None)
    grad = torch.tensor(GRADS[1], dtype=torch.float64)
    if case != "masked":
        grad[1] = float(case)
    new, ok, after = step(alpha, grad, state, clip=None, ok=case != "masked")
    assert not bool(ok) and torch.equal(new, alpha)
    assert all(torch.equal(getattr(after, k), getattr(state, k)) for k in ("m", "v", "step_count"))


def test_the_state_saves_and_restores_and_refuses_another_size():
    cfg = type("Cfg", (), {"lr": LR, "betas": BETAS, "eps": EPS, "scale_grad_clip": None})()
    alpha = torch.tensor(ALPHA, dtype=torch.float64)
    first = ScaleAdam(alpha, cfg)
    for grad in GRADS[:2]:
        alpha, _ = first.step(alpha, torch.tensor(grad, dtype=torch.float64), torch.tensor(True))
    second = ScaleAdam(alpha, cfg)
    second.load_state_dict(first.state_dict())
    grad = torch.tensor(GRADS[2], dtype=torch.float64)
    a1, _ = first.step(alpha, grad, torch.tensor(True))
    a2, _ = second.step(alpha, grad, torch.tensor(True))
    assert torch.equal(a1, a2) and int(second.step_count) == 3
    with pytest.raises(ValueError, match="saved for another model"):
        ScaleAdam(torch.ones(3, dtype=torch.float64), cfg).load_state_dict(first.state_dict())
