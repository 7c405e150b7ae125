"""A GradInit phase stopped inside fairseq-train resumes from --save-dir and ends with the scales of an
uninterrupted phase."""
import json

import pytest
import torch

pytest.importorskip("fairseq")

import fairseq_gradinit.fairseq_plugin.phase.compute as phase  # noqa: E402
from fairseq_helpers import make_tiny_bin  # noqa: E402
from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


# With dropout the saved state holds every rank's random state: the resumed phase draws the same masks.
@pytest.mark.parametrize("dropout", [False, True], ids=["eval", "dropout"])
def test_stopped_phase_resumes_where_it_stopped_and_matches_an_uninterrupted_one(tmp_path, monkeypatch, caplog,
                                                                                dropout):
    data = make_tiny_bin(tmp_path, {"train": 120, "valid": 10, "test": 10}, 300)
    common = [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
              "--gradinit-iters", "7", "--gradinit-checkpoint-interval", "2", "--gradinit-lr", "0.05"]
    if dropout:
        common += ["--gradinit-dropout", "true"]  # TINY_MODEL has --dropout 0.1
    train_inprocess(common + ["--save-dir", str(tmp_path / "whole")])
    whole = json.loads((tmp_path / "whole" / "gradinit.json").read_text())
    assert not (tmp_path / "whole" / "gradinit.state.pt").exists()

    real = phase.gradinit
    seen = []

    def stop_at_5(*args, callback=None, **kwargs):
        def cb(rec):
            seen.append(rec.iteration)
            if rec.iteration == 5:
                raise KeyboardInterrupt
        return real(*args, callback=cb, **kwargs)

    save = tmp_path / "stopped"
    monkeypatch.setattr(phase, "gradinit", stop_at_5)
    caplog.set_level("INFO")
    with pytest.raises(SystemExit) as exc:
        train_inprocess(common + ["--save-dir", str(save)])
    assert exc.value.code == 130
    assert "resume GradInit after iteration 4" in caplog.text
    state = torch.load(save / "gradinit.state.pt", weights_only=True)
    assert len(state["state"]["history"]) == 4 and not (save / "gradinit.json").exists()

    monkeypatch.setattr(phase, "gradinit", real)
    train_inprocess(common + ["--save-dir", str(save)])
    assert "resuming the GradInit phase" in caplog.text and "after iteration 4" in caplog.text
    resumed = json.loads((save / "gradinit.json").read_text())
    assert resumed["scales"] == whole["scales"]
    assert [r["branch"] for r in resumed["history"]] == [r["branch"] for r in whole["history"]]
    assert not (save / "gradinit.state.pt").exists()


def test_a_phase_state_of_another_run_is_refused(tmp_path):
    data = make_tiny_bin(tmp_path, {"train": 60, "valid": 10, "test": 10}, 300)
    save = tmp_path / "ck"
    save.mkdir()
    (save / "gradinit.state.pt").write_bytes(b"not a state")
    with pytest.raises(SystemExit, match="not a readable GradInit phase state"):
        train_inprocess([str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update",
                         "1", "--gradinit-iters", "2", "--save-dir", str(save)])
