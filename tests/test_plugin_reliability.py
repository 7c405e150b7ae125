"""Reliability of the fairseq plugin under real use (issue 12): bad input, resume paths, provenance,
unsupported setups, import side effects and interruption. docs/reliability.md maps each case here."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fairseq")

from fairseq import options  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

from fairseq_gradinit.fairseq_plugin import provenance  # noqa: E402
from test_fairseq_plugin import TINY_MODEL, env_with_repo, tiny_data, train_inprocess  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[1]


def _argv(data, save, *extra):
    return [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
            "--save-dir", str(save), *extra]


def test_fingerprint_from_args_matches_the_config_fairseq_train_uses(tiny_data, tmp_path):
    """The study runner's fingerprint (argument list, no model) equals the one of the config that
    fairseq-train actually runs with; it is portable across a copied data-bin and sensitive to what
    determines GradInit."""
    argv = _argv(tiny_data, tmp_path / "a", "--gradinit-iters", "2")
    from_args = provenance.fingerprint_from_args(argv)
    train_inprocess(argv)
    assert json.loads((tmp_path / "a" / "gradinit.json").read_text())["fingerprint"] == from_args
    assert from_args["seed"] == 3 and from_args["world_size"] == 1
    assert from_args["model"]["arch"] == "transformer_iwslt_de_en" and from_args["model"]["encoder_layers"] == 2
    assert "lr" not in from_args["model"] and "save_dir" not in from_args["model"]
    assert from_args["gradinit"]["resolved"]["eta"] == 1e-3
    files = from_args["data"]["dirs"][0]
    assert {"dict.de.txt", "dict.en.txt", "train.de-en.de.idx", "train.de-en.en.idx"} <= set(files)
    assert "sha256" in files["dict.de.txt"] and "sha256" not in files["train.de-en.de.bin"]
    json.dumps(from_args)  # JSON-ready

    # A copy of the data-bin elsewhere (new path, new mtimes) matches; a changed dictionary does not.
    copy = tmp_path / "copied-bin"
    shutil.copytree(tiny_data, copy)
    moved = provenance.fingerprint_from_args([str(copy), *argv[1:]])
    assert provenance.fingerprint_diff(from_args, moved) == []
    with open(copy / "dict.de.txt", "a") as f:
        f.write("extra 1\n")
    changed = provenance.fingerprint_from_args([str(copy), *argv[1:]])
    assert any(d.startswith("data.dirs.0.dict.de.txt") for d in provenance.fingerprint_diff(from_args, changed))
    for extra, key in ((["--seed", "4"], "seed"), (["--dropout", "0.2"], "model.dropout"),
                       (["--gradinit-gamma", "3"], "gradinit."), (["--label-smoothing", "0.2"], "criterion."),
                       (["--distributed-world-size", "2"], "world_size")):
        other = provenance.fingerprint_from_args(argv + extra)
        diff = provenance.fingerprint_diff(from_args, other)
        assert diff and all(d.startswith(key) for d in diff), (extra, diff)
    # What does not change GradInit's result does not change the fingerprint.
    same = provenance.fingerprint_from_args(argv + ["--max-update", "7", "--gradinit-log-interval", "3",
                                                    "--save-dir", str(tmp_path / "elsewhere")])
    assert provenance.fingerprint_diff(from_args, same) == []
