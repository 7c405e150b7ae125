"""A command replaces an existing file only when it wrote that file itself (the mark each output carries:
``written_by`` in JSON, a first-line header in text, the ``Software`` text of a PNG, the gzip header's
name of a .tar.gz), and one command at a time writes an output folder (its lock). docs/reliability.md
("Outputs that are not the command's own" and "Two commands into one folder") maps each case here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fairseq_helpers import small_corpus

ROOT = Path(__file__).resolve().parents[2]
LOG_LINE = "2026-11-27 10:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.5 | num_updates 2\n"


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_only_a_file_the_command_wrote_is_replaced(tmp_path):
    from fairseq_gradinit.files import paths

    cmd = "gradinit-plot-curves"
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\nkeep them\n")  # UTF-8 text, but not the command's
    md = paths.text_output("a table", cmd, markdown=True)
    with pytest.raises(paths.OutputError, match="its first line is not '<!-- written by gradinit-plot-curves; "):
        paths.check_output("--out", notes, md)
    ours = tmp_path / "ours.md"
    ours.write_text(paths.header_line(cmd, markdown=True) + "\n| a |\n")
    paths.check_output("--out", ours, md)

    result = paths.json_result("curves", "metric", "runs", command=cmd)
    other = tmp_path / "other.json"
    paths.write_json(other, {"metric": "loss", "runs": {}}, command="gradinit-evaluate-bleu")
    with pytest.raises(paths.OutputError, match="it was written by gradinit-evaluate-bleu, not by gradinit-plot-curves"):
        paths.check_output("--out", other, result)
    mine = tmp_path / "mine.json"
    paths.write_json(mine, {"metric": "loss", "runs": {}}, command=cmd)
    paths.check_output("--out", mine, result)
    assert json.loads(mine.read_text())["written_by"] == cmd

    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    fig.savefig(tmp_path / "user.png")  # a plot of the user's own
    fig.savefig(tmp_path / "own.png", metadata=paths.png_metadata(cmd))
    plt.close(fig)
    with pytest.raises(paths.OutputError, match="gradinit-plot-curves did not write it"):
        paths.check_output("--out", tmp_path / "user.png", paths.png_output(cmd))
    paths.check_output("--out", tmp_path / "own.png", paths.png_output(cmd))

    with tarfile.open(tmp_path / "user.tar.gz", "w:gz"):
        pass
    with paths.marked_tar_gz(tmp_path / "own.tar.gz", "python -m lab.study"):
        pass
    archive = paths.tar_gz_output("python -m lab.study")
    with pytest.raises(paths.OutputError, match="python -m lab.study did not write it"):
        paths.check_output("--archive", tmp_path / "user.tar.gz", archive)
    paths.check_output("--archive", tmp_path / "own.tar.gz", archive)
    with tarfile.open(tmp_path / "own.tar.gz") as tar:  # still an ordinary .tar.gz
        assert tar.getnames() == []


def test_plot_curves_never_replaces_a_users_file_and_replaces_its_own(tmp_path, capsys):
    from fairseq_gradinit.tools import plot_curves

    log = tmp_path / "train.log"
    log.write_text(LOG_LINE)
    notes = tmp_path / "curves.md"
    notes.write_text("my notes on the run\n")
    argv = ["--run", f"a={log}", "--out", str(tmp_path / "curves"), "--no-png"]
    assert plot_curves.main(argv) == 2
    assert f"error: --out {notes} exists and its first line is not" in capsys.readouterr().err
    assert notes.read_text() == "my notes on the run\n" and not (tmp_path / "curves.json").exists()
    notes.unlink()
    assert plot_curves.main(argv) == 0
    assert plot_curves.main(argv) == 0  # again: its own files are replaced
    assert json.loads((tmp_path / "curves.json").read_text())["written_by"] == "gradinit-plot-curves"


def test_an_output_name_too_long_for_its_file_system_is_refused_before_any_work(tmp_path, capsys):
    """A name over the file system's limit (255 bytes here) fails when the file is written, at the end of
    the work; the output check refuses it first, for every command that uses it."""
    from fairseq_gradinit.files import paths
    from fairseq_gradinit.tools import plot_curves

    long = tmp_path / ("c" * 300)
    with pytest.raises(paths.OutputError, match=r"the name, 'c{40}\.\.\.', is 305 bytes long, more than the \d+ "
                                                r"bytes a file name may have there; give a shorter name"):
        paths.check_output("--output-json", str(long) + ".json", paths.json_result("r", "m", "runs",
                                                                                command="gradinit-evaluate-bleu"))
    assert paths.name_too_long("--out", tmp_path / ("c" * 200)) is None
    log = tmp_path / "train.log"
    log.write_text(LOG_LINE)
    assert plot_curves.main(["--run", f"a={log}", "--out", str(long), "--no-png"]) == 2
    assert "give a shorter name" in capsys.readouterr().err and list(tmp_path.iterdir()) == [log]


def test_json_we_write_is_strict(tmp_path):
    """NaN and infinities are written as null: strict readers (JSON.parse, jq, json.loads with
    parse_constant refusing) read every file."""
    from fairseq_gradinit.files.paths import write_json

    path = tmp_path / "r.json"
    write_json(path, {"loss": float("nan"), "curve": [1.0, float("inf"), {"x": -float("inf")}]}, command="c")

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    assert json.loads(path.read_text(), parse_constant=refuse) == {"written_by": "c", "loss": None,
                                                                     "curve": [1.0, None, {"x": None}]}


def test_no_json_is_written_outside_the_one_writer():
    """Every JSON file of the package and the lab is written by fairseq_gradinit.files.paths (strict, marked):
    the other json.dumps calls make log lines and hashes, never files."""
    allowed = {("fairseq_gradinit/files/paths.py", "json.dumps(finite_json(obj)"),
               ("fairseq_gradinit/fairseq_plugin/phase/compute.py", "json.dumps(settings, default=str)"),
               ("fairseq_gradinit/fairseq_plugin/phase/provenance.py", "json.dumps(value, default=str, sort_keys=True)"),
               ("fairseq_gradinit/fairseq_plugin/phase/provenance.py", "json.dumps(value, sort_keys=True, default=str)"),
               ("lab/study/plan.py", "json.dumps(compared, sort_keys=True, default=str)"),
               # the key of the plan's cache: the settings and the init file's identity on disk
               ("fairseq_gradinit/fairseq_plugin/settings/plan.py", "json.dumps([dict(settings))")}
    found = set()
    for folder in ("fairseq_gradinit", "lab"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("lab/record/"):
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                for call in ("json.dump(", "json.dumps("):
                    at = line.find(call)
                    if at >= 0:
                        found.add((rel, line[at:at + len(call) + 60].split(")")[0] + ")"))
    assert {f for f in found if not any(f[0] == a and f[1].startswith(b[:-1]) for a, b in allowed)} == set()


# -- compare-vision and train-vision ------------------------------------------------------------
TINY = ["--dataset", "synthetic", "--synthetic-train-size", "96", "--synthetic-test-size", "32",
        "--synthetic-shape", "1,8,8", "--model", "vgg19", "--no-bn", "--width", "0.0625", "--batch-size", "32",
        "--test-batch-size", "32", "--epochs", "1", "--workers", "0", "--threads", "1", "--log-interval", "0",
        "--no-progress"]
COMPARE_TINY = ["--dataset", "synthetic", "--synthetic-train-size", "96", "--synthetic-test-size", "32",
                "--synthetic-shape", "1,8,8", "--no-bn", "--width", "0.0625", "--batch-size", "32", "--steps", "2",
                "--gradinit-iters", "2", "--test-batches", "1", "--test-batch-size", "16", "--log-interval", "1",
                "--threads", "1", "--no-progress"]


def test_compare_vision_replaces_only_its_own_runs_and_files(tmp_path, capsys):
    from fairseq_gradinit.tools import compare_vision
    from fairseq_gradinit.tools.train_vision import cli as train_vision

    out = tmp_path / "cmp"
    train_vision.main(train_vision.get_args_parser().parse_args(TINY + ["--output-dir", str(out / "kaiming")]))
    before = snapshot(out)
    # before: it passed --overwrite for the user and replaced this gradinit-train-vision run
    assert compare_vision.main([*COMPARE_TINY, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert (f"error: --output-dir {out}: {out / 'kaiming'} holds a run of gradinit-train-vision; "
            "gradinit-compare-vision replaces only its own runs") in err, err
    assert snapshot(out) == before and not (out / "gradinit").exists()

    checkpoint = out / "kaiming" / "checkpoint.pt"  # before: --json wrote over it after both runs
    mine = tmp_path / "mine"
    assert compare_vision.main([*COMPARE_TINY, "--output-dir", str(mine), "--json", str(checkpoint)]) == 2
    assert f"error: --json {checkpoint}: gradinit-compare-vision writes a JSON file there" in capsys.readouterr().err
    foreign = tmp_path / "foreign.json"  # a .json name that holds someone else's binary file
    foreign.write_bytes((out / "kaiming" / "checkpoint.pt").read_bytes())
    assert compare_vision.main([*COMPARE_TINY, "--output-dir", str(mine), "--json", str(foreign)]) == 2
    assert f"error: --json {foreign} exists and it holds binary data" in capsys.readouterr().err
    assert snapshot(out) == before and not mine.exists()

    assert compare_vision.main([*COMPARE_TINY, "--output-dir", str(mine)]) == 0
    first = json.loads((mine / "kaiming" / "log.json").read_text())
    assert first["written_by"] == "gradinit-compare-vision"
    assert compare_vision.main([*COMPARE_TINY, "--output-dir", str(mine)]) == 0  # its own runs: replaced
    assert json.loads((mine / "compare.json").read_text())["written_by"] == "gradinit-compare-vision"


def test_train_vision_overwrite_replaces_only_a_run_of_its_own(tmp_path):
    from fairseq_gradinit.tools.train_vision import cli as train_vision

    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"PK\x03\x04 another tool's checkpoint")
    before = snapshot(out)
    with pytest.raises(train_vision.UsageError, match=(
            rf"--output-dir {out} holds checkpoint.pt, which gradinit-train-vision did not write .*even with "
            "--overwrite")):
        train_vision.main(train_vision.get_args_parser().parse_args(TINY + ["--output-dir", str(out), "--overwrite"]))
    assert snapshot(out) == before


HOLD = ("import sys\nfrom fairseq_gradinit.files.locks import folder_lock\n"
        "with folder_lock(sys.argv[1], flag='--out', command=sys.argv[2]):\n"
        "    print('held', flush=True)\n    sys.stdin.read()\n")


class Holder:
    """Another live process that holds the lock of a folder (as a running command does) until closed."""

    def __init__(self, folder: Path, command: str):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout.readline().strip() == "held"

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def test_a_second_train_vision_run_into_one_folder_is_refused_while_the_first_runs(tmp_path):
    from fairseq_gradinit.tools.train_vision import cli as train_vision

    out = tmp_path / "run"
    first = Holder(out, "gradinit-train-vision")
    try:  # before: both ran, and one run's files were left
        with pytest.raises(train_vision.RunFailure, match=(
                rf"--output-dir {out}: another gradinit-train-vision \(pid {first.proc.pid} on host .*\) is writing "
                "there .*Wait until it has finished, or give --output-dir another path")):
            train_vision.main(train_vision.get_args_parser().parse_args(TINY + ["--output-dir", str(out)]))
        assert not out.exists()
    finally:
        first.close()
    log = train_vision.main(train_vision.get_args_parser().parse_args(TINY + ["--output-dir", str(out)]))
    assert len(log["epochs"]) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no lock file left


def test_a_second_prepare_corpus_into_one_out_leaves_the_first_ones_partial_build(tmp_path, caplog):
    from fairseq_gradinit.tools import prepare_corpus

    corpus = small_corpus(tmp_path)
    out = tmp_path / "prepared"
    partial = prepare_corpus.staging_dir(out)
    first = Holder(out, "gradinit-prepare-corpus")
    try:  # the first run is building in its partial folder
        (partial / "spm").mkdir(parents=True)
        (partial / "spm" / "spm.model").write_bytes(b"being written")
        argv = [str(corpus), "--src", "de", "--tgt", "en", "--vocab-size", "200", "--workers", "1", "--out", str(out)]
        assert prepare_corpus.main(argv) == 1
        assert (f"--out {out}: another gradinit-prepare-corpus (pid {first.proc.pid} on host" in caplog.text)
        # before: the second run deleted it as "left by an interrupted run" and built in it too
        assert (partial / "spm" / "spm.model").read_bytes() == b"being written" and not out.exists()
    finally:
        first.close()
