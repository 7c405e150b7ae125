"""Scales that are no result are never written or applied: a run that ends on iterations with a
non-finite loss or gradient, or with scales that are not finite, raises and leaves the model as it was
given; ``apply_scales`` is all or nothing. docs/reliability.md ("Results that are not what was asked")."""
import copy

import pytest
import torch
from torch import nn

from fairseq_gradinit.core import BatchPair, GradInitConfig, apply_scales, gradinit
from test_engine import _with_nan, ce_loss, make_mlp, make_pairs


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_run_whose_last_iterations_were_not_finite_is_no_result():
    model = make_mlp()
    init = copy.deepcopy(model)
    pairs = make_pairs(5)
    bad = list(pairs[:3]) + [BatchPair(_with_nan(p.s), p.s_tilde) for p in pairs[3:]]
    cfg = GradInitConfig(eta=0.05, gamma=1e3, lr=0.05, iters=5)
    # before: the scales of iteration 3, which gave NaN on the last two batches, were returned and applied
    with pytest.warns(RuntimeWarning, match="GradInit iteration"):
        with pytest.raises(FloatingPointError, match=r"the last 2 iterations had a non-finite loss or gradient at the "
                                                     r"final scales .*the model is left as it was given"):
            gradinit(model, bad, ce_loss, cfg)
    assert _same(model, init)
    # a skipped iteration followed by good ones is a result, as before
    mixed = list(pairs)
    mixed[2] = BatchPair(_with_nan(pairs[2].s), pairs[2].s_tilde)
    with pytest.warns(RuntimeWarning):
        assert gradinit(model, mixed, ce_loss, cfg).num_skipped == 1


def test_apply_scales_is_all_or_nothing():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model.register_parameter("steps", nn.Parameter(torch.ones(2, dtype=torch.long), requires_grad=False))
    before = copy.deepcopy(model)
    scales = {"0.weight": 2.0, "1.weight": 0.5, "steps": 3.0}
    # before: 0.weight and 1.weight were scaled, then the integer tensor failed
    with pytest.raises(ValueError, match="'steps' is a torch.int64 tensor"):
        apply_scales(model, scales)
    assert _same(model, before)
    assert apply_scales(model, {"0.weight": 2.0, "1.weight": 0.5}) == ["0.weight", "1.weight"]
    assert torch.equal(model[0].weight, before[0].weight * 2.0)
    with pytest.raises(ValueError, match="not finite numbers"):
        apply_scales(model, {"0.weight": float("nan")})
