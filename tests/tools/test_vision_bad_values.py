"""gradinit-train-vision and gradinit-compare-vision: a seed or hyper-parameter out of range, a device
this machine lacks, a path whose name the file system cannot hold are one ``error:`` line and exit
status 2 before any data is loaded or any run trains, never a traceback (numpy's seed range, SGD's
checks, torch's device errors) and never a run with NaN settings. docs/reliability.md ("Malformed
files and values")."""
from __future__ import annotations

import argparse
import sys

import pytest
import torch

from fairseq_gradinit.tools import compare_vision
from fairseq_gradinit.tools.train_vision import cli as train_vision

TINY = ["--dataset", "synthetic", "--model", "vgg19", "--width", "0.0625", "--synthetic-train-size", "32",
        "--synthetic-test-size", "8", "--batch-size", "8", "--epochs", "1", "--limit-train-batches", "1",
        "--limit-test-batches", "1", "--workers", "0"]


@pytest.mark.parametrize("extra, expected", [
    (["--seed", "-1"], "argument --seed: invalid value '-1': expected an integer in [0, 4294967295]"),
    (["--seed", str(2 ** 32)], "argument --seed: invalid value '4294967296': expected an integer in [0, 4294967295]"),
    (["--lr", "-1"], "argument --lr: invalid value -1: expected a finite number >= 0"),
    (["--lr", "nan"], "argument --lr: invalid value nan: expected a finite number >= 0"),
    (["--momentum", "-1"], "argument --momentum: invalid value -1: expected a number in [0, 1]"),
    (["--wd", "-1"], "argument --wd/--weight-decay: invalid value -1: expected a finite number >= 0"),
    (["--clip-grad-norm", "-1"], "argument --clip-grad-norm: invalid value -1: expected a finite number >= 0"),
    (["--threads", "-1"], "argument --threads: invalid value -1: expected an integer >= 1"),
    (["--workers", "-1"], "argument --workers: invalid value -1: expected an integer >= 0"),
    (["--log-interval", "-1"], "argument --log-interval: invalid value -1: expected an integer >= 0"),
    (["--synthetic-classes", "0"], "argument --synthetic-classes: invalid value 0: expected an integer >= 1"),
    (["--synthetic-train-size", "-4"], "argument --synthetic-train-size: invalid value -4: expected an integer >= 1"),
    (["--cutout-length", "-3"], "argument --cutout-length: invalid value -3: expected an integer >= 0"),
])
def test_train_vision_values_out_of_range_are_argument_errors(tmp_path, capsys, extra, expected):
    with pytest.raises(SystemExit) as stop:
        train_vision.cli([*TINY, "--output-dir", str(tmp_path / "run"), *extra])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.strip().splitlines()[-1].endswith(f"error: {expected}"), err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_a_device_this_machine_lacks_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    cases = [("cuda", "argument --device: cuda: this machine has no CUDA device that torch can use; use --device "
                      "cpu, or leave --device out to take a GPU when there is one"),
             ("foo", "argument --device: invalid value 'foo': expected a torch device such as cpu, cuda or cuda:1")]
    for device, expected in cases:
        assert train_vision.cli([*TINY, "--output-dir", str(tmp_path / "run"), "--device", device]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"{sys.argv[0].split('/')[-1]}: error: {expected}"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert train_vision.cli([*TINY, "--output-dir", str(tmp_path / "run"), "--device", "cuda:3"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "error: argument --device: cuda:3: this machine has 1 CUDA device(s), cuda:0 to cuda:0; pick one of them")
    assert not (tmp_path / "run").exists()


def test_an_over_long_name_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    long_dir = tmp_path / ("r" * 300)
    assert train_vision.cli([*TINY, "--output-dir", str(long_dir)]) == 2
    err = capsys.readouterr().err
    assert err.strip().endswith(f"error: --output-dir {long_dir}: the name, '{'r' * 40}...', is 300 bytes long, "
                                "more than the 255 bytes a file name may have there; give a shorter name"), err
    lock_too_long = tmp_path / ("r" * 250)  # a legal folder name, but its lock .NAME.lock beside it is not
    assert train_vision.cli([*TINY, "--output-dir", str(lock_too_long)]) == 2
    assert "the name of its lock file beside it, '.rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr...', is 256 bytes long" \
        in capsys.readouterr().err

    monkeypatch.setattr(compare_vision, "run_arm", lambda targs: pytest.fail("a run was started"))
    long_json = tmp_path / ("j" * 260 + ".json")  # before: found by the write after both runs
    assert compare_vision.main([*TINY[:2], "--output-dir", str(tmp_path / "cmp"), "--json", str(long_json)]) == 2
    err = capsys.readouterr().err
    assert f"error: --json {long_json}: the name, '{'j' * 40}...', is 265 bytes long" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra, flag", [(["--seed", "-1"], "--seed"), (["--steps", "0"], "--steps"),
                                         (["--width", "0"], "--width"), (["--batch-size", "-8"], "--batch-size")])
def test_compare_vision_values_out_of_range_are_its_own_argument_errors(tmp_path, capsys, extra, flag):
    with pytest.raises(SystemExit) as stop:
        compare_vision.main(["--dataset", "synthetic", "--output-dir", str(tmp_path / "cmp"), *extra])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"error: argument {flag}: invalid value" in err and "Traceback" not in err
    assert not (tmp_path / "cmp").exists()


def test_the_seed_type_accepts_the_whole_range():
    assert train_vision.seed("0") == 0 and train_vision.seed(str(2 ** 32 - 1)) == 2 ** 32 - 1
    with pytest.raises(argparse.ArgumentTypeError):
        train_vision.seed("1.5")
