"""Issue 18: scripts/prepare_corpus.py and scripts/train_vision.py never lose a user's work and answer
mistakes with one message. docs/reliability.md ("Scripts and the vision API") maps each case here.

prepare_corpus.py runs on the first 300/40/40 lines of the shared debian-ui-de-en corpus with a
200-piece vocabulary; train_vision.py on tiny synthetic data or tiny fake dataset folders.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
SHARED_CORPUS = ROOT.parent / "shared" / "data" / "debian-ui-de-en"


def load(name):
    spec = importlib.util.spec_from_file_location(f"_reliability_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


prepare_corpus = load("prepare_corpus")


def run_python(code, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------------
# prepare_corpus.py
# ------------------------------------------------------------------------------------------------
def small_corpus(tmp_path, sizes=(("train", 300), ("valid", 40), ("test", 40))):
    if not SHARED_CORPUS.is_dir():
        pytest.skip(f"shared corpus not found: {SHARED_CORPUS}")
    pytest.importorskip("sentencepiece")
    if importlib.util.find_spec("fairseq_cli") is None:
        pytest.skip("fairseq is not installed")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, n in sizes:
        for lang in ("de", "en"):
            with open(SHARED_CORPUS / f"{split}.{lang}", "rb") as f:
                (corpus / f"{split}.{lang}").write_bytes(b"".join(next(f) for _ in range(n)))
    return corpus


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
import importlib.util, os, signal, sys, time
spec = importlib.util.spec_from_file_location("prepare_corpus", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)
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
