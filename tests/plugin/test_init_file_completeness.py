"""A gradinit.json that lacks the scale of one of the model's tensors (edited by hand, e.g. a study's
cached group) is refused when applied, naming the tensor, instead of leaving it unscaled."""
import json

import pytest

pytest.importorskip("fairseq")

from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


def _argv(data, save, *extra):
    return [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
            "--save-dir", str(save), *extra]


def test_a_scale_removed_by_hand_is_refused_naming_the_tensor(tiny_data, tmp_path, caplog):
    train_inprocess(_argv(tiny_data, tmp_path / "gi", "--gradinit-iters", "1"))
    saved = json.loads((tmp_path / "gi" / "gradinit.json").read_text())
    removed = "decoder.layers.1.fc2.weight"
    assert removed in saved["scales"]
    del saved["scales"][removed]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(saved))

    for how, argv in (("init file", _argv(tiny_data, tmp_path / "a", "--gradinit-init-file", str(edited))),
                      ("reused", _argv(tiny_data, tmp_path / "b", "--gradinit-iters", "1"))):
        if how == "reused":  # the same run's gradinit.json found in its --save-dir
            (tmp_path / "b").mkdir()
            (tmp_path / "b" / "gradinit.json").write_text(edited.read_text())
        with pytest.raises(SystemExit) as exc:
            train_inprocess(argv)
        message = str(exc.value.code)
        assert message.startswith("gradinit: error: ") and f"no scale for 1 of this model's tensors, e.g. " \
            f"['{removed}']" in message, (how, message)
        assert not list(tmp_path.glob("[ab]/checkpoint*.pt"))

    # the whole file applies (tied aliases and all-zero biases need no scale of their own)
    caplog.set_level("INFO")
    train_inprocess(_argv(tiny_data, tmp_path / "c", "--gradinit-init-file", str(tmp_path / "gi" / "gradinit.json")))
    assert f"applied {len(saved['scales']) + 1} scales" in caplog.text
