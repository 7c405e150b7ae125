"""A gradinit.json or gradinit.state.pt whose fields are not what the plugin wrote (edited, damaged, of
another tool) is refused in one line naming the field, never a traceback from deep inside the phase.
docs/reliability.md ("Malformed files and values")."""
import json

import pytest
import torch

pytest.importorskip("fairseq")

from fairseq_gradinit.fairseq_plugin.phase.state import load_phase_state, save_phase_state  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.init_file import read_init_file  # noqa: E402


@pytest.mark.parametrize("field, value, expected", [
    ("fingerprint", ["seed", 3], "its field 'fingerprint' is list"),
    ("gamma", "large", "its field 'gamma' is str 'large', not a number"),
    ("config", 5, "its field 'config' is int 5, not an object"),
    ("history", [1, 2], "its field 'history' holds entries that are not objects"),
    ("clamped_from", "x.json", "its field 'clamped_from' is str"),
])
def test_a_gradinit_json_with_a_malformed_field_is_refused_naming_it(tmp_path, field, value, expected):
    path = tmp_path / "gradinit.json"
    path.write_text(json.dumps({"scales": {"w": 0.5}, field: value}))
    # before: read as a result, then an AttributeError/TypeError where the field was used
    with pytest.raises(ValueError, match=f"--gradinit-init-file {path}: {expected}"):
        read_init_file(str(path))
    path.write_text(json.dumps({"scales": {"w": 0.5}, "gamma": 3.0, "history": [{"loss_s": 1.0}]}))
    assert read_init_file(str(path))["gamma"] == 3.0


def _state(**changes):
    state = {"format": 1, "names": ["w"], "w_sq_norms": [1.0], "config": {}, "alpha": torch.ones(1),
             "adam": {"m": torch.zeros(1)}, "adam_constraint": None, "history": [{"iteration": 1}],
             "consecutive_skips": 0, "last_branch": "objective", "gamma": 2.0}
    state.update(changes)
    return state


@pytest.mark.parametrize("changes, expected", [
    ({"history": "ten"}, "its field 'history' is str, not list"),
    ({"alpha": [1.0]}, "its field 'alpha' is list, not Tensor"),
    ({"gamma": "x"}, "its field 'gamma' is str"),
    ({"history": [3]}, "its history holds entries that are not dicts"),
])
def test_a_phase_state_with_a_malformed_field_is_refused_naming_it(tmp_path, changes, expected):
    path = str(tmp_path / "gradinit.state.pt")
    save_phase_state(path, _state(**changes), {"seed": 1})
    # before: len(state["history"]) or the engine's load raised a TypeError/KeyError traceback
    with pytest.raises(ValueError, match=f"is not a readable GradInit phase state \\(ValueError: {expected}\\); "
                                         "delete .* to start GradInit anew"):
        load_phase_state(path, {"seed": 1}, lambda a, b: [])
    save_phase_state(path, _state(), {"seed": 1})
    assert load_phase_state(path, {"seed": 1}, lambda a, b: [])["gamma"] == 2.0
