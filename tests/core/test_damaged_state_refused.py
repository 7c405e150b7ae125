"""A saved GradInit state is checked as a whole before a run resumes from it: shapes,
signs, keys and finiteness. docs/reliability.md ("Numbers that do not survive their dtype, damaged saved
states ...")."""
import copy

import pytest
import torch

from fairseq_gradinit.core import gradinit
from test_resume_gradinit import CFG, Net, loss_fn, pairs


@pytest.fixture(scope="module")
def saved():
    torch.manual_seed(0)
    base = Net().double()
    states = []

    def stop_at_5(rec):
        if rec.iteration == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gradinit(copy.deepcopy(base), pairs(12), loss_fn, CFG, callback=stop_at_5, checkpoint=states.append,
                 checkpoint_interval=4)
    return base, states[0]


def _damaged(state, how):
    state = copy.deepcopy(state)
    n = state["alpha"].numel()
    if how == "alpha too short":
        state["alpha"] = state["alpha"][:1].clone()
    elif how == "alpha negative":
        state["alpha"][0] = -0.5
    elif how == "alpha nan":
        state["alpha"][1] = float("nan")
    elif how == "adam v too long":
        state["adam"]["v"] = torch.zeros(n + 1, dtype=state["adam"]["v"].dtype)
    elif how == "history extra key":
        state["history"][0]["note"] = 1
    elif how == "history missing key":
        del state["history"][1]["branch"]
    return state


@pytest.mark.parametrize("how, words", [
    ("alpha too short", r"its 'alpha' \(the scales\) has shape \(1,\), but the model has \d+ scaled tensors"),
    ("alpha negative", r"its 'alpha' \(the scales\) holds negative values, e.g. -0.5"),
    ("alpha nan", r"its 'alpha' \(the scales\) holds values that are not finite"),
    ("adam v too long", r"its 'adam' moment 'v' has shape \(\d+,\), but the model has \d+ scaled tensors"),
    ("history extra key", r"its history entry 1 has keys no GradInit iteration has: \['note'\]"),
    ("history missing key", r"its history entry 2 has no \['branch'\]"),
])
def test_a_damaged_state_is_refused_before_the_run_resumes(saved, how, words):
    base, state = saved
    model = copy.deepcopy(base)
    # before: a short or negative alpha resumed (copy_ broadcast it) and gave a result; the others a traceback
    with pytest.raises(ValueError, match="the GradInit state is damaged: " + words):
        gradinit(model, pairs(12)[4:], loss_fn, CFG, state=_damaged(state, how))
    for p, q in zip(model.parameters(), base.parameters()):
        assert torch.equal(p, q)
    assert gradinit(copy.deepcopy(base), pairs(12)[4:], loss_fn, CFG, state=state).history  # intact: resumes
