"""The commands, in one line and before their work: a full disk while saving, arguments checked before any training, class
folders that differ, a resume with other settings, a --path that is no checkpoint. docs/reliability.md
("Numbers that do not survive their dtype, damaged saved states ...")."""
import argparse
import errno
import os
from pathlib import Path

import pytest

from fairseq_gradinit.files.paths import save_atomic


def test_a_failed_torch_save_is_an_oserror_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import shutil

    def torch_save_on_a_full_disk(f):
        Path(f).write_bytes(b"PK\x03\x04partial")
        raise RuntimeError("[enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(100, 100, 0))
    # before: torch's RuntimeError (the handler caught only OSError), and checkpoint.pt.tmp left behind
    with pytest.raises(OSError) as e:
        save_atomic(torch_save_on_a_full_disk, tmp_path / "checkpoint.pt")
    assert e.value.errno == errno.ENOSPC and "No space left on device" in str(e.value)
    assert os.listdir(tmp_path) == []
    save_atomic(lambda f: Path(f).write_text("ok"), tmp_path / "checkpoint.pt")
    assert os.listdir(tmp_path) == ["checkpoint.pt"]


def test_compare_vision_and_plot_curves_check_their_arguments_before_any_training(tmp_path, capsys):
    from fairseq_gradinit.tools import compare_vision, plot_curves
    from fairseq_gradinit.tools.train_vision.errors import UsageError

    # before: the whole Kaiming run trained, then the GradInit run refused -5 (and suggested None)
    with pytest.raises(SystemExit) as e:
        compare_vision.get_args_parser().parse_args(["--gradinit-iters", "-5"])
    assert e.value.code == 2 and "argument --gradinit-iters: invalid value" in capsys.readouterr().err
    for flag, value, words in (("--json", f"{tmp_path}/", "is a folder"), ("--plot", str(tmp_path / "x.json"),
                                                                           "writes a PNG file there")):
        args, _ = compare_vision.get_args_parser().parse_known_args(["--output-dir", str(tmp_path / "out"),
                                                                     flag, value])
        with pytest.raises(UsageError, match=words):
            compare_vision.check_outputs(args)
    # before: a ValueError traceback from Path.with_name
    for out in (".", "/", "", "runs/"):
        with pytest.raises(SystemExit) as e:
            plot_curves.build_parser().parse_args(["--run", f"a={tmp_path}/log", "--out", out])
        assert e.value.code == 2 and "names a folder, not a file prefix" in capsys.readouterr().err


def test_imagefolder_class_folders_that_differ_are_named(tmp_path):
    from fairseq_gradinit.tools.train_vision.data import class_folders_differ

    for split, classes in (("train", ("cat", "dog")), ("val", ("cat", "cow", "dog"))):
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
    # before: labels shifted, 0.00 % test accuracy, exit 0
    assert class_folders_differ(tmp_path / "train", tmp_path / "val") == (
        "the class folders of train/ and val/ differ (only in train/: none; only in val/: ['cow'])")
    (tmp_path / "train" / "cow").mkdir()
    assert class_folders_differ(tmp_path / "train", tmp_path / "val") is None


def test_a_resume_with_other_settings_is_refused():
    from fairseq_gradinit.tools.train_vision.cli import resume_changes

    saved = {"lr": 0.1, "batch_size": 128, "seed": 0, "wd": 5e-4, "momentum": 0.9, "epochs": 3}
    same = argparse.Namespace(**saved)
    # before: the new values were used while log.json recorded the first ones
    assert resume_changes(saved, same) is None
    assert resume_changes(saved, argparse.Namespace(**{**saved, "lr": 0.05, "seed": 2})) == \
        "--lr 0.1 -> 0.05, --seed 0 -> 2"


def test_valid_loss_modes_refuses_a_path_that_is_no_checkpoint(tmp_path, capsys):
    from fairseq_gradinit.files.checkpoints import checkpoint_file_error
    from fairseq_gradinit.tools import valid_loss_modes

    path = tmp_path / "gradinit.json"
    path.write_text('{"scales": {}}')
    # before: a traceback from torch.load
    with pytest.raises(SystemExit) as e:
        valid_loss_modes.main([str(tmp_path), "--path", str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --path: {path} is JSON, not a checkpoint that torch.save wrote" in err and "Traceback" not in err
    assert checkpoint_file_error(path) is not None
    (tmp_path / "empty.pt").write_bytes(b"")
    assert checkpoint_file_error(tmp_path / "empty.pt") == "is empty"


def test_the_docs_section_of_issue_51_names_tests_that_exist():
    """Each item of docs/reliability.md's section on numbers, damaged states, ignored options and full disks
    names the test that checks it, in a file it names."""
    import re

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = doc.split("## Numbers that do not survive their dtype, damaged saved states")[1].split("\n## ")[0]
    named = re.findall(r"tests/((?:\w+/)?test_\w+\.py)::(test_\w+)", section)
    assert len(named) >= 14
    missing = [f"{f}::{n}" for f, n in named if f"def {n}(" not in (repo / "tests" / f).read_text(encoding="utf-8")]
    assert not missing, missing
    items = [line for line in section.splitlines() if line.startswith("- ")]
    tests = [line for line in section.splitlines() if line.startswith("  - test: ")]
    assert len(items) >= 13 and len(tests) == len(items), items
    assert all(re.search(r"`tests/[^`]*::test_\w+`", line) for line in tests), tests
