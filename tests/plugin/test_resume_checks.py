"""A resume whose command line does not fit the checkpoint is refused with one line before fairseq
loads it (before: fairseq's "Cannot load model parameters" traceback)."""
import pytest

pytest.importorskip("fairseq")

from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


def test_resuming_a_shared_checkpoint_with_per_use_scales_is_refused(tiny_data, tmp_path, caplog):
    save = tmp_path / "ck"
    argv = [str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--save-dir", str(save),
            "--gradinit-iters", "1"]
    train_inprocess(argv + ["--max-update", "1"])  # shared scales (the default)
    before = (save / "checkpoint_last.pt").read_bytes()
    with pytest.raises(SystemExit) as exc:
        train_inprocess(argv + ["--max-update", "2", "--gradinit-tied-embeddings", "per-use"])
    message = str(exc.value.code)
    assert message == (f"gradinit: error: the checkpoint {save / 'checkpoint_last.pt'} was trained with shared scales "
                       "of the tied embeddings (its state has no per-use multiplier such as encoder.embed_scale): "
                       "resume it without --gradinit-tied-embeddings per-use (the tying of a run is fixed when it "
                       "starts)")
    assert (save / "checkpoint_last.pt").read_bytes() == before
    caplog.set_level("INFO")
    train_inprocess(argv + ["--max-update", "2"])  # the same resume without the flag works
    assert "a checkpoint will be restored; not running GradInit" in caplog.text
