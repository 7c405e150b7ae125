"""A GradInit result that cannot be written into --save-dir (disk full, permissions) is not lost
without a word: it goes to the temporary folder, and the one-line error says where."""
import errno
import json

import pytest

pytest.importorskip("fairseq")

from fairseq_gradinit.fairseq_plugin.data import files  # noqa: E402
from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


def test_disk_full_while_writing_gradinit_json_keeps_the_result(tiny_data, tmp_path, monkeypatch):
    save = tmp_path / "ck"
    real = files.atomic_write_json

    def disk_full(path, obj):
        if str(path).startswith(str(save)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, obj)

    monkeypatch.setattr(files, "atomic_write_json", disk_full)
    monkeypatch.setattr(files.tempfile, "tempdir", str(tmp_path))
    with pytest.raises(SystemExit) as exc:
        train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
                         "--max-update", "1", "--save-dir", str(save), "--gradinit-iters", "2"])
    message = str(exc.value.code)
    (kept,) = tmp_path.glob("gradinit-*.json")
    assert message == (f"gradinit: error: could not write {save / 'gradinit.json'} (No space left on device); the "
                       f"result was saved to {kept} instead: free space (or fix the permissions) and copy it to "
                       f"{save / 'gradinit.json'}, or pass --gradinit-init-file {kept} to apply it without computing "
                       "it again")
    result = json.loads(kept.read_text())
    assert result["iterations"] == 2 and result["scales"] and result["fingerprint"]
    assert not (save / "gradinit.json").exists() and not (save / "checkpoint_last.pt").exists()


def test_gradinit_with_only_non_finite_losses_is_one_line(tiny_data, tmp_path, monkeypatch):
    """Every iteration skipped (NaN loss): the engine gives up after --gradinit-max-consecutive-skips;
    fairseq-train ends with its reason in one line (before: a FloatingPointError traceback)."""
    from fairseq_gradinit.fairseq_plugin.registration import hook

    def nan_loss(criterion):
        def loss_fn(model, sample):
            loss, _, _ = criterion(model, sample)
            return loss * float("nan")
        return loss_fn

    monkeypatch.setattr(hook, "mean_loss_fn", nan_loss)  # the loss the task hands the phase
    save = tmp_path / "ck"
    with pytest.raises(SystemExit) as exc:
        train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
                         "--max-update", "1", "--save-dir", str(save), "--gradinit-iters", "20",
                         "--gradinit-max-consecutive-skips", "3"])
    message = str(exc.value.code)
    assert message.startswith("gradinit: error: GradInit: 3 consecutive iterations had a non-finite loss or gradient"), \
        message
    assert message.endswith(f"{save / 'gradinit.json'} was not written and training did not start.") and "\n" not in message
    assert not (save / "gradinit.json").exists() and not (save / "checkpoint_last.pt").exists()
