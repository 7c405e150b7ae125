"""Numbers the phase's dtype cannot resolve and parameters GradInit cannot scale, refused before any work. docs/reliability.md ("Numbers that do not survive their dtype, damaged saved states
...")."""
import copy

import pytest
import torch
from torch import nn


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_finite_difference_step_below_float32s_resolution_is_refused():
    from fairseq_gradinit.core import GradInitConfig

    # before: accepted; the difference was exactly 0 and every scale stayed at 1.0
    with pytest.raises(ValueError, match=r"fd_eps.*1e-30.*expected a number in \[1\.19e-07, 1\) with "
                                         r"constraint_grad='finite_difference'"):
        GradInitConfig(constraint_grad="finite_difference", fd_eps=1e-30)
    GradInitConfig(constraint_grad="finite_difference", fd_eps=1e-4)
    GradInitConfig(constraint_grad="exact", fd_eps=1e-30)  # not used by the exact gradient


@pytest.mark.parametrize("make, words", [
    (lambda: nn.Sequential(nn.Embedding(5, 3, sparse=True), nn.Linear(3, 2)),
     r"parameter '0.weight' is the weight of an Embedding with sparse=True"),
    (lambda: _Complex(), r"parameter 'w' is a complex tensor \(torch.complex64\)"),
])
def test_parameters_gradinit_cannot_scale_are_named_before_any_work(make, words):
    from fairseq_gradinit.core import gradinit

    model = make()
    before = copy.deepcopy(model)
    # before: a traceback from inside autograd or the scale buffer
    with pytest.raises(ValueError, match=words):
        gradinit(model, [torch.zeros(2, dtype=torch.long)] * 4, lambda m, b: m(b).abs().sum(), iters=1)
    assert _same(model, before)


class _Complex(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2, dtype=torch.complex64))

    def forward(self, b):
        return self.w * b
