"""scripts/prepare_corpus.py and scripts/train_vision.py never lose a user's work and answer
mistakes with one message. docs/reliability.md ("Scripts and the vision API") maps each case here.

prepare_corpus.py runs on the first 300/40/40 lines of the repository's debian-ui-de-en corpus (data/) with a
200-piece vocabulary; train_vision.py on tiny synthetic data or tiny fake dataset folders.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_helpers import small_corpus

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


from fairseq_gradinit.tools import prepare_corpus  # noqa: E402


def run_python(code, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # SIGINT at its default in the child, as in a terminal (a shell without job control ignores it in background jobs)
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# ------------------------------------------------------------------------------------------------
# prepare_corpus.py
# ------------------------------------------------------------------------------------------------
def prepare_argv(corpus, out, *extra, vocab=200):
    return [str(corpus), "--src", "de", "--tgt", "en", "--vocab-size", str(vocab), "--workers", "1",
            "--out", str(out), *extra]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def hidden_leftovers(out: Path) -> list:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_prepare_corpus_failed_overwrite_keeps_the_old_data(tmp_path, caplog):
    corpus = small_corpus(tmp_path)
    out = tmp_path / "prepared"
    assert prepare_corpus.main(prepare_argv(corpus, out)) == 0
    before = snapshot(out)
    assert "prepare_corpus.json" in before and "bin/dict.de.txt" in before and "spm/spm.model" in before

    # the new build fails (vocabulary too large for 300 lines): the old data-bin is all still there
    caplog.clear()
    assert prepare_corpus.main(prepare_argv(corpus, out, "--overwrite", vocab=100000)) == 1
    assert "SentencePiece training failed: " in caplog.text and "Vocabulary size too high" in caplog.text
    assert "spm_train.log" not in caplog.text  # it was in the removed staging folder
    assert snapshot(out) == before and hidden_leftovers(out) == []

    # a build killed hard (no cleanup) leaves its staging folder: the next run removes it and says so
    stale = prepare_corpus.staging_dir(out)
    (stale / "bin").mkdir(parents=True)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="prepare_corpus")
    assert prepare_corpus.main(prepare_argv(corpus, out, "--overwrite", vocab=150)) == 0
    assert f"removed {stale}, a partial build left by an interrupted run" in caplog.text
    summary = json.loads((out / "prepare_corpus.json").read_text(encoding="utf-8"))
    assert summary["spm_vocab_size"] == 150 and summary["data_bin"] == str((out / "bin").resolve())
    import sentencepiece as spm

    assert spm.SentencePieceProcessor(model_file=str(out / "bin" / "spm.model")).get_piece_size() == 150
    assert hidden_leftovers(out) == []


def test_prepare_corpus_detects_a_partial_build(tmp_path, caplog):
    out = tmp_path / "prepared"
    (out / "bin").mkdir(parents=True)
    (out / "bin" / "dict.de.txt").write_text("x 1\n")
    (out / "spm").mkdir()
    corpus = small_corpus(tmp_path)
    assert prepare_corpus.main(prepare_argv(corpus, out)) == 1
    assert (f"{out} holds a partial build (spm/ and bin/ without prepare_corpus.json, left by an interrupted or "
            "failed run); pass --overwrite to replace it") in caplog.text
    assert "already holds prepared data" not in caplog.text


def test_prepare_corpus_names_a_non_utf8_line_before_training(tmp_path, caplog, monkeypatch):
    corpus = small_corpus(tmp_path)
    lines = (corpus / "valid.en").read_bytes().split(b"\n")
    lines[2] = b"caf\xe9 " + lines[2]  # latin-1
    (corpus / "valid.en").write_bytes(b"\n".join(lines))
    monkeypatch.setattr(prepare_corpus, "train_spm", lambda *a: pytest.fail("SentencePiece must not start"))
    out = tmp_path / "prepared"
    assert prepare_corpus.main(prepare_argv(corpus, out)) == 1
    assert (f"{corpus / 'valid.en'}, line 3: byte 0xe9 at byte 4 of the line is not UTF-8; the corpus must be "
            "UTF-8 text (convert it first, e.g. iconv -f latin1 -t utf-8)") in caplog.text
    assert not out.exists() and hidden_leftovers(out) == []


def test_prepare_corpus_refuses_an_out_that_is_a_file(tmp_path, caplog):
    corpus = small_corpus(tmp_path)
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    assert prepare_corpus.main(prepare_argv(corpus, target)) == 2
    assert prepare_corpus.main(prepare_argv(corpus, target / "sub")) == 2
    assert f"--out {target}: {target} is an existing file, not a folder; give a folder path" in caplog.text
    assert target.read_text() == "mine\n" and hidden_leftovers(target) == []


INTERRUPT = """
import os, signal, sys, time
from fairseq_gradinit.tools import prepare_corpus as m
def ctrl_c(*args):  # Ctrl-C while fairseq-preprocess runs
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)
m.run_preprocess = ctrl_c
sys.exit(m.main(sys.argv[2:]))
"""


def test_prepare_corpus_ctrl_c_exits_130_and_leaves_out_as_it_was(tmp_path):
    corpus = small_corpus(tmp_path)
    out = tmp_path / "prepared"
    assert prepare_corpus.main(prepare_argv(corpus, out, "--quiet")) == 0
    before = snapshot(out)
    proc = run_python(INTERRUPT, SCRIPTS / "prepare_corpus.py", *prepare_argv(corpus, out, "--overwrite", vocab=150))
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (f"interrupted (Ctrl-C): {out} was left as it was and the partial build was removed; run the same "
            "command again to prepare the data") in proc.stderr
    assert snapshot(out) == before and hidden_leftovers(out) == []


# ------------------------------------------------------------------------------------------------
# train_vision.py
# ------------------------------------------------------------------------------------------------
from fairseq_gradinit.tools.train_vision import cli as train_vision  # noqa: E402
from fairseq_gradinit.tools.train_vision import data as train_vision_data  # noqa: E402
from fairseq_gradinit.tools.train_vision import initialization as train_vision_init  # noqa: E402

TINY = ["--dataset", "synthetic", "--synthetic-train-size", "96", "--synthetic-test-size", "32",
        "--synthetic-shape", "1,8,8", "--model", "vgg19", "--no-bn", "--width", "0.0625", "--batch-size", "32",
        "--test-batch-size", "32", "--epochs", "1", "--workers", "0", "--threads", "1", "--log-interval", "0",
        "--no-progress"]


def tv_args(out, *extra):
    argv = TINY + (["--output-dir", str(out)] if out is not None else []) + list(extra)
    return train_vision.get_args_parser().parse_args(argv)


def test_train_vision_never_replaces_a_run_without_resume_or_overwrite(tmp_path):
    run = tmp_path / "run"
    train_vision.main(tv_args(run))
    before = snapshot(run)
    assert set(before) == {"checkpoint.pt", "log.json", "log.csv"}
    with pytest.raises(train_vision.UsageError, match=(
            rf"--output-dir {run} already holds a run \(checkpoint.pt, log.json, log.csv\); continue it with "
            r"--resume auto, start a new one there with --overwrite, or choose another --output-dir")):
        train_vision.main(tv_args(run, "--lr", "0.05"))
    assert snapshot(run) == before
    with pytest.raises(train_vision.UsageError, match="--resume and --overwrite exclude each other"):
        train_vision.main(tv_args(run, "--resume", "auto", "--overwrite"))
    other = tmp_path / "other"
    train_vision.main(tv_args(other, "--seed", "1"))
    with pytest.raises(train_vision.UsageError, match=rf"--output-dir {run} holds another run .*resuming "):
        train_vision.main(tv_args(run, "--resume", str(other / "checkpoint.pt")))
    assert snapshot(run) == before
    # the explicit choices still work
    log = train_vision.main(tv_args(run, "--epochs", "2", "--resume", "auto"))
    assert [r["epoch"] for r in log["epochs"]] == [1, 2]
    log = train_vision.main(tv_args(run, "--lr", "0.05", "--overwrite"))
    assert len(log["epochs"]) == 1 and json.loads((run / "log.json").read_text())["args"]["lr"] == 0.05
    # logs without a checkpoint: nothing to resume, still not overwritten silently
    (tmp_path / "logs-only").mkdir()
    (tmp_path / "logs-only" / "log.json").write_text("{}")
    with pytest.raises(train_vision.UsageError, match="holds log.json but no checkpoint.pt to resume from"):
        train_vision.main(tv_args(tmp_path / "logs-only", "--resume", "auto"))


def test_train_vision_default_folder_tells_runs_apart(tmp_path, monkeypatch):
    def name(*extra):
        args = tv_args(None, *extra)
        args.batch_size = args.batch_size or 128
        return train_vision.default_output_dir(args)

    base = name()
    assert base == "runs/synthetic-vgg19-nobn-w0.0625-kaiming-lr0.1-e1-wd0.0001-b32-s0"
    variants = [name("--lr", "0.05"), name("--epochs", "2"), name("--wd", "0"), name("--seed", "1"),
                name("--batch-size", "16"), name("--init", "gradinit"),
                name("--init", "gradinit", "--gradinit-lr", "0.05"), name("--limit-train-batches", "2")]
    assert len({base, *variants}) == 1 + len(variants)
    monkeypatch.chdir(tmp_path)
    train_vision.main(tv_args(None))
    assert (tmp_path / base / "checkpoint.pt").is_file()


def test_train_vision_missing_data_is_one_message_and_leaves_no_folder(tmp_path, monkeypatch):
    out = tmp_path / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(train_vision_data, "FASHION_MNIST_DIRS", ())
    cases = [
        (["--dataset", "fashion-mnist", "--data-dir", str(empty)],
         r"Fashion-MNIST not found .*pass --data-dir pointing to a folder with train-images-idx3-ubyte.gz"),
        (["--dataset", "imagefolder", "--data-dir", str(empty)],
         rf"--data-dir {empty}: --dataset imagefolder expects the folders {empty}/train and {empty}/val"),
        (["--dataset", "cifar10", "--data-dir", str(empty), "--no-download"],
         rf"--data-dir {empty}: CIFAR-10 not found \(no readable cifar-10-batches-py in it\); drop --no-download"),
    ]
    for extra, message in cases:
        with pytest.raises(train_vision.UsageError, match=message):
            train_vision.main(tv_args(out, *extra))
    assert not out.exists()
    (empty / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + (2).to_bytes(4, "big") * 3 + b"\x00")
    for stem in ("train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (empty / stem).write_bytes(b"")
    with pytest.raises(train_vision.RunFailure, match=(
            rf"--dataset fashion-mnist: {empty}/train-images-idx3-ubyte: expected 8 bytes of data after the header, "
            "found 1")):
        train_vision.main(tv_args(out, "--dataset", "fashion-mnist", "--data-dir", str(empty)))
    assert not out.exists()


def test_train_vision_bad_resume_files(tmp_path):
    run = tmp_path / "run"
    train_vision.main(tv_args(run))
    out = tmp_path / "new"
    with pytest.raises(train_vision.UsageError, match=rf"--resume {tmp_path}/nope.pt: no such file"):
        train_vision.main(tv_args(out, "--resume", str(tmp_path / "nope.pt")))
    import torch

    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(train_vision.UsageError, match=(
            rf"--resume {foreign} is not a checkpoint of train_vision.py \(it lacks model, optimizer, epoch")):
        train_vision.main(tv_args(out, "--resume", str(foreign)))
    truncated = tmp_path / "truncated.pt"
    data = (run / "checkpoint.pt").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(train_vision.RunFailure, match=rf"--resume {truncated}: cannot read the checkpoint .*truncated"):
        train_vision.main(tv_args(out, "--resume", str(truncated)))
    with pytest.raises(train_vision.UsageError, match=(
            rf"--resume {run}/checkpoint.pt holds another network \(--dataset synthetic, --model vgg19, --bn False, "
            r"--width 0.0625; .*\); resume with the settings of the run that saved it")):
        train_vision.main(tv_args(out, "--resume", str(run / "checkpoint.pt"), "--width", "0.125"))
    assert not out.exists()


def test_train_vision_unstepped_uses_matching_nothing_stops_before_the_initialization(tmp_path, caplog):
    out = tmp_path / "run"
    caplog.set_level("INFO")
    with pytest.raises(train_vision.UsageError) as exc:
        train_vision.main(tv_args(out, "--init", "gradinit", "--gradinit-unstepped-uses", "classifier$"))
    message = str(exc.value)
    assert message.startswith("argument --gradinit-unstepped-uses: 'classifier$' matches no use of a parameter that "
                              "GradInit steps; give a regular expression (searched in each name) on the names of the "
                              "uses, which here are e.g. ['"), message
    assert "gradinit iter" not in caplog.text.lower() and not out.exists()
    # a pattern that names a use is accepted and the run trains
    train_vision.main(tv_args(out, "--init", "gradinit", "--gradinit-unstepped-uses", "classifier"))
    assert (out / "log.json").exists()


def test_train_vision_too_few_batches(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(train_vision.UsageError, match=(
            r"GradInit pairs consecutive batches and needs at least 2 per pass, but --limit-train-batches 1 "
            r"gives 1: raise --limit-train-batches")):
        train_vision.main(tv_args(out, "--init", "gradinit", "--limit-train-batches", "1"))
    with pytest.raises(train_vision.UsageError, match=(
            r"--batch-size 128 is larger than the training set \(96 images\); lower --batch-size")):
        train_vision.main(tv_args(out, "--batch-size", "128"))
    with pytest.raises(train_vision.UsageError, match=(
            r"--gradinit-batch-size 64 on 96 images gives 1: raise --limit-train-batches, lower "
            r"--gradinit-batch-size")):
        train_vision.main(tv_args(out, "--init", "gradinit", "--gradinit-batch-size", "64"))
    with pytest.raises(train_vision.UsageError, match=r"--metainit-batch-size 200 is larger than the training set"):
        train_vision.main(tv_args(out, "--init", "metainit", "--metainit-batch-size", "200"))
    assert not out.exists()
    # with --gradinit-iters one batch is cycled, as the API does
    log = train_vision.main(tv_args(out, "--init", "gradinit", "--limit-train-batches", "1", "--gradinit-iters", "2"))
    assert log["init"]["iterations"] == 2


def test_train_vision_cli_exit_status_without_traceback(tmp_path):
    script = SCRIPTS / "train_vision.py"
    out = tmp_path / "run"
    bad = run_python("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                     script, *TINY, "--output-dir", out, "--init", "gradinit", "--limit-train-batches", "1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.splitlines()[-1].startswith("train_vision.py: error: GradInit pairs consecutive batches")
    assert not out.exists()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(b"PK\x03\x04 not a whole file")
    failed = run_python("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
                        script, *TINY, "--output-dir", out, "--resume", truncated)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert failed.stderr.splitlines()[-1].startswith(f"train_vision.py: error: --resume {truncated}: cannot read")
    assert not out.exists()


TV_INTERRUPT = """
import os, signal, sys
from fairseq_gradinit.tools.train_vision import cli, loop
evaluate, calls = loop.evaluate, []
def ctrl_c_in_epoch_2(*args):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGINT)
    return evaluate(*args)
loop.evaluate = ctrl_c_in_epoch_2
sys.exit(cli.cli(sys.argv[2:]))
"""


def test_train_vision_ctrl_c_exits_130_and_says_what_the_checkpoint_holds(tmp_path):
    out = tmp_path / "run"
    proc = run_python(TV_INTERRUPT, SCRIPTS / "train_vision.py", *TINY, "--epochs", "3", "--output-dir", out)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"interrupted (Ctrl-C) during epoch 2; {out}/checkpoint.pt holds epoch 1: continue with --resume auto"
            in proc.stderr)
    log = train_vision.main(tv_args(out, "--epochs", "3", "--resume", "auto"))
    assert [r["epoch"] for r in log["epochs"]] == [1, 2, 3]


GROUP_INTERRUPT = """
import multiprocessing, os, signal, sys, time
from fairseq_cli import preprocess
from fairseq_gradinit.tools import prepare_corpus as m
def forking_preprocess(args):  # fairseq-preprocess with worker processes, then Ctrl-C in a terminal
    pool = multiprocessing.Pool(2)
    waits = [pool.apply_async(time.sleep, (30,)) for _ in range(2)]
    time.sleep(1)
    os.killpg(0, signal.SIGINT)  # the terminal signals the whole foreground process group
    time.sleep(30)
preprocess.main = forking_preprocess
sys.exit(m.main(sys.argv[2:]))
"""


def test_prepare_corpus_ctrl_c_with_preprocess_workers_prints_no_traceback(tmp_path):
    corpus = small_corpus(tmp_path)
    out = tmp_path / "prepared"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", GROUP_INTERRUPT, str(SCRIPTS / "prepare_corpus.py"),
                           *prepare_argv(corpus, out, "--quiet")], cwd=str(ROOT), env=env, capture_output=True,
                          text=True, timeout=300, start_new_session=True)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr, proc.stderr
    assert "interrupted (Ctrl-C)" in proc.stderr
    assert not out.exists() and hidden_leftovers(out) == []


@pytest.mark.parametrize("extra, expected", [
    (["--init", "gradinit", "--gradinit-gamma", "-1"],
     "argument --gradinit-gamma: invalid value -1.0: expected a finite number > 0, or None to use the rule of thumb"),
    (["--init", "gradinit", "--gradinit-lr", "0"], "argument --gradinit-lr: invalid value 0.0: expected a finite number > 0"),
    (["--init", "gradinit", "--gradinit-iters", "-1"], "argument --gradinit-iters: invalid value -1: expected an integer >= 0"),
    (["--init", "gradinit", "--gradinit-eta", "nan"], "argument --gradinit-eta: invalid value nan: expected a finite number > 0"),
    (["--init", "gradinit", "--lr", "0"], "argument --lr (the default of --gradinit-eta): invalid value 0.0"),
    (["--init", "gradinit", "--gradinit-min-scale", "0.5", "--gradinit-max-scale", "0.1"],
     "argument --gradinit-max-scale: invalid value 0.1: expected None or a finite number >= min_scale (0.5)"),
    (["--init", "gradinit", "--gradinit-min-scale", "2"],
     "argument --gradinit-min-scale: invalid value 2.0: expected a number in (0, 1] (the paper uses 0.01)"),
    (["--init", "metainit", "--metainit-lr", "0"], "argument --metainit-lr: invalid value 0.0: expected a finite number > 0"),
    (["--init", "metainit", "--metainit-iters", "-1"], "argument --metainit-iters: invalid value -1: expected an integer >= 0"),
    (["--init", "metainit", "--metainit-eps", "nan"], "argument --metainit-eps: invalid value nan: expected a finite number > 0"),
    (["--init", "kaiming", "--gradinit-overlap", "2"], "argument --gradinit-overlap: invalid value 2.0: expected a number in [0, 1]"),
])
def test_train_vision_refuses_bad_init_values_before_building_anything(tmp_path, monkeypatch, capsys, extra, expected):
    """A bad --gradinit-*/--metainit-* value is one line, exit 2, before the data or the model is built."""
    def never(*args, **kwargs):
        raise AssertionError("built before the values were checked")

    monkeypatch.setattr(train_vision, "build_datasets", never)
    monkeypatch.setattr(train_vision_init, "create_model", never)
    out = tmp_path / "run"
    assert train_vision.cli(TINY + ["--output-dir", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.split(": error: ", 1)[1].startswith(expected), err  # "PROG: error: ..." (PROG: argv[0])
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_train_vision_warns_about_init_flags_its_init_does_not_read(tmp_path, caplog):
    caplog.set_level("WARNING")
    args = tv_args(tmp_path / "k", "--init", "kaiming", "--gradinit-iters", "5", "--metainit-iters", "3")
    assert train_vision.check_init_options(args) == ["--gradinit-iters 5", "--metainit-iters 3"]
    train_vision.main(args)
    assert "ignoring --gradinit-iters 5, --metainit-iters 3: --init kaiming runs neither GradInit nor MetaInit" \
        in caplog.text
    # MetaInit reads GradInit's scale bounds and tau, not its other settings; GradInit reads no --metainit-*
    meta = tv_args(None, "--init", "metainit", "--gradinit-min-scale", "0.02", "--gradinit-gamma", "2")
    assert train_vision.check_init_options(meta) == ["--gradinit-gamma 2.0"]
    gi = tv_args(None, "--init", "gradinit", "--gradinit-gamma", "2", "--metainit-batch-size", "32")
    assert train_vision.check_init_options(gi) == ["--metainit-batch-size 32"]


@pytest.mark.parametrize("width", ["0", "-1", "nan"])
def test_train_vision_width_must_be_positive(tmp_path, capsys, width):
    with pytest.raises(SystemExit) as exc:
        train_vision.get_args_parser().parse_args(TINY + ["--output-dir", str(tmp_path / "run"), "--width", width])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert "argument --width: invalid value" in err and "expected a finite number > 0" in err, err


def test_plot_curves_refuses_a_log_or_monitor_file_of_another_kind(tmp_path, capsys):
    """A --run that is no fairseq-train log, or a --monitor that is no monitor.jsonl (e.g. the two swapped):
    one error, exit status 2, nothing written (before: an empty curve with a warning, or empty panels)."""
    from fairseq_gradinit.tools import plot_curves

    log = tmp_path / "train.log"
    log.write_text("2026-11-27 10:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.5 | "
                   "num_updates 2\n")
    monitor = tmp_path / "monitor.jsonl"
    monitor.write_text(json.dumps({"type": "start", "update": 0, "time": 1, "version": "0.5.0"}) + "\n" +
                       json.dumps({"type": "interval", "update": 2, "loss_scale": 128.0}) + "\n")
    out = tmp_path / "curves"
    assert plot_curves.main(["--run", f"a={monitor}", "--out", str(out), "--no-png"]) == 2
    err = capsys.readouterr().err
    assert f"error: --run a={monitor} is not a fairseq-train log: no line of it is in fairseq's logging format" in err
    assert plot_curves.main(["--run", f"a={log}", "--monitor", f"a={log}", "--out", str(out), "--no-png"]) == 2
    err = capsys.readouterr().err
    assert f"error: --monitor a={log} is not a monitor.jsonl of --gradinit-monitor-interval: no line of it is a " \
        "monitor record (a JSON object whose 'type' is one of start, interval, overflow)" in err, err
    monitor.write_text(json.dumps({"type": "start", "update": 0}) + "\n")  # a record without its schema's version
    assert plot_curves.main(["--run", f"a={log}", "--monitor", f"a={monitor}", "--out", str(out), "--no-png"]) == 2
    assert "its start record (line 1) has no 'version'" in capsys.readouterr().err
    assert not list(tmp_path.glob("curves.*"))
