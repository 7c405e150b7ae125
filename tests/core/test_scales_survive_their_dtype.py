"""Scales are checked in the dtype they are applied in, and a tied tensor gets one scale. docs/reliability.md ("Numbers that do not survive their dtype, damaged saved states ...")."""
import copy

import pytest
import torch
from torch import nn

from fairseq_gradinit.core import apply_scales, scales_error


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("weight, value, words", [
    (0.5, 1e-50, r"the scale 1e-50 of '0.weight' is 0 in torch.float32"),
    (0.5, 1e39, r"the scale 1e\+39 of '0.weight' is inf in torch.float32"),
    (5.0, 1e38, r"the scale 1e\+38 of '0.weight' makes values of that tensor overflow to inf in torch.float32"),
    (0.1, 2e-45, r"the scale 2e-45 of '0.weight' makes that tensor all zero in torch.float32"),
])
def test_a_scale_that_float32_makes_zero_or_inf_is_refused_and_the_model_unchanged(weight, value, words):
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    with torch.no_grad():
        model[0].weight.fill_(weight)
    before = copy.deepcopy(model)
    # before: applied, the weight all zero or inf, no error
    with pytest.raises(ValueError, match="cannot apply these scales: " + words):
        apply_scales(model, {"1.weight": 2.0, "0.weight": value})
    assert _same(model, before)
    # in float64 the same small scale is a number
    model64 = copy.deepcopy(model).double()
    apply_scales(model64, {"0.weight": 1e-50})
    assert model64[0].weight.abs().min() > 0


def test_scales_error_in_a_dtype_names_the_tensor():
    assert scales_error({"a.weight": 1e-50}) is None  # no dtype: the rule as before
    assert "'a.weight' is 0 in torch.float32" in scales_error({"a.weight": 1e-50}, torch.float32)
    assert "'a.weight' is inf in torch.float16" in scales_error({"a.weight": 1e5}, torch.float16)
    assert scales_error({"a.weight": 0.5, "a.bias": 0.0}, torch.float32) is None


def test_conflicting_scales_of_one_tied_tensor_are_refused():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight  # tied: two names of one tensor
    before = copy.deepcopy(model)
    # before: 2.0 applied, 0.5 ignored without a word
    with pytest.raises(ValueError, match=r"'0.weight' and '1.weight' are names of one tied tensor, but the scales "
                                         r"give it 2 and 0.5"):
        apply_scales(model, {"0.weight": 2.0, "1.weight": 0.5})
    assert _same(model, before)
    # the same scale under both names is one scale, applied once
    assert apply_scales(model, {"0.weight": 2.0, "1.weight": 2.0}) == ["0.weight"]
    assert torch.equal(model[0].weight, before[0].weight * 2.0)

