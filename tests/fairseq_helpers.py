"""Helpers shared by the fairseq tests: a tiny data-bin from the repository's corpus, gloo rank launches."""
from __future__ import annotations

import functools
import socket
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS_ARCHIVE = REPO / "data" / "debian-ui-de-en.tar.xz"


@functools.lru_cache(maxsize=None)
def _corpus_files() -> Dict[str, bytes]:
    with tarfile.open(CORPUS_ARCHIVE, "r:xz") as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def corpus_file(split: str, lang: str) -> bytes:
    """``{split}.{lang}`` of the Debian UI corpus, read from the repository's archive (no extraction)."""
    return _corpus_files()[f"{split}.{lang}"]


def corpus_head(split: str, lang: str, n: int) -> bytes:
    """The first ``n`` lines of ``{split}.{lang}``, byte for byte."""
    lines = corpus_file(split, lang).split(b"\n")[:-1]
    assert len(lines) >= n, f"{split}.{lang} has {len(lines)} lines, fewer than {n}"
    return b"".join(line + b"\n" for line in lines[:n])


def small_corpus(tmp_path: Path, sizes=(("train", 300), ("valid", 40), ("test", 40))) -> Path:
    """``tmp_path/corpus``: the first ``n`` lines of each split of the corpus, byte for byte, for
    ``scripts/prepare_corpus.py``. Skips the test without sentencepiece or fairseq."""
    import importlib.util

    pytest.importorskip("sentencepiece")
    if importlib.util.find_spec("fairseq_cli") is None:
        pytest.skip("fairseq is not installed")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, n in sizes:
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_bytes(corpus_head(split, lang, n))
    return corpus


def make_tiny_bin(root: Path, sizes: Dict[str, int], nwords: int) -> Path:
    """The first ``sizes[split]`` lines of the corpus, binarized with a joined dictionary of
    ``nwords`` words (whitespace tokens)."""
    from fairseq import options
    from fairseq_cli import preprocess

    for split, n in sizes.items():
        for lang in ("de", "en"):
            (root / f"{split}.{lang}").write_bytes(corpus_head(split, lang, n))
    preprocess.main(options.get_preprocessing_parser().parse_args([
        "--source-lang", "de", "--target-lang", "en", "--trainpref", str(root / "train"),
        "--validpref", str(root / "valid"), "--testpref", str(root / "test"),
        "--destdir", str(root / "bin"), "--joined-dictionary", "--nwordssrc", str(nwords), "--workers", "1",
    ]))
    return root / "bin"


def make_tiny_lm_bin(root: Path, sizes: Dict[str, int], nwords: int, lang: str = "en") -> Path:
    """A language-model data-bin (``fairseq-preprocess --only-source``) of the first ``sizes[split]``
    lines of one side of the corpus."""
    from fairseq import options
    from fairseq_cli import preprocess

    for split, n in sizes.items():
        (root / f"{split}.txt").write_bytes(corpus_head(split, lang, n))
    prefs = {"train": "--trainpref", "valid": "--validpref", "test": "--testpref"}
    argv = ["--only-source", "--destdir", str(root / "lmbin"), "--nwordssrc", str(nwords), "--workers", "1"]
    for split in sizes:
        argv += [prefs[split], str(root / split) + ".txt"]
    preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    return root / "lmbin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(cmds: Sequence[Sequence[str]], *, cwd: Path, env: dict, timeout: float) -> List[str]:
    """Start one process per command at once (the ranks of a job), wait for all, and assert each
    exited 0; returns their combined stdout/stderr. A timeout kills every rank."""
    procs = [subprocess.Popen(list(c), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in cmds]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
        raise
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return outs


def study_main(argv: Sequence[str]):
    """``python -m lab.study ARGV`` in this process: (exit status, stdout, stderr)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from lab.study import cli as study_cli

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = study_cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()
