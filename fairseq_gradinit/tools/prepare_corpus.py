#!/usr/bin/env python3
"""Prepare a local parallel corpus for fairseq with a joint SentencePiece model.

One SentencePiece model is always trained on both sides (as the paper's IWSLT setup has one joint
BPE). The fairseq dictionaries are joint by default (one dictionary for both sides, needed by
``--share-all-embeddings``); ``--separate-dicts`` builds a source dictionary from the encoded
source text and a target dictionary from the encoded target text (the authors' IWSLT setting,
trained with ``--share-decoder-input-output-embed``).

Input: a directory with plain-text, line-aligned files

    CORPUS_DIR/{train,valid,test}.{SRC,TGT}

Output (``--out OUT``):

    OUT/spm/spm.model, OUT/spm/spm.vocab     joint SentencePiece model (trained on train SRC+TGT)
    OUT/spm/spm_train.log                    SentencePiece trainer log
    OUT/spm/{train,valid,test}.{SRC,TGT}     the splits as space-separated pieces
    OUT/bin/                                 fairseq-preprocess output (dict.SRC.txt,
                                             dict.TGT.txt, *.bin/*.idx, preprocess.log) plus a
                                             copy of spm.model/spm.vocab; the two dicts are
                                             identical unless --separate-dicts
    OUT/prepare_corpus.json                  summary: arguments, line counts, vocab sizes, timings

The build is made in a hidden folder beside OUT (``.OUT.partial``) and moved into OUT only when it
has succeeded, so a failed or interrupted run (``--overwrite`` included) leaves OUT as it was.

``OUT/bin`` is the DATA directory for fairseq-train / fairseq-generate; decode with
``--remove-bpe sentencepiece`` (alias of ``--post-process sentencepiece``).

Example (the repository's corpus, unpacked with ``tar -xJf data/debian-ui-de-en.tar.xz -C data``)::

    python scripts/prepare_corpus.py data/debian-ui-de-en \\
        --src de --tgt en --vocab-size 6000 --out data-bin/debian-ui-de-en
    # separate dictionaries (train with --share-decoder-input-output-embed)
    python scripts/prepare_corpus.py data/debian-ui-de-en \\
        --src de --tgt en --vocab-size 6000 --separate-dicts --out data-bin/debian-ui-de-en-sep
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Sequence

from ..command_line.argtypes import float_in, int_at_least
from ..command_line.quiet import quiet_command
from ..files.locks import FolderBusy, folder_lock
from ..files.paths import FOLDER, OutputError, check_output, utf8_problem, write_json

logger = logging.getLogger("prepare_corpus")
COMMAND = "gradinit-prepare-corpus"

SPLITS = ("train", "valid", "test")
SPM_PREFIX = "spm"
SUMMARY = "prepare_corpus.json"
ENCODE_CHUNK = 10000


class PrepareError(RuntimeError):
    """A user-facing error (missing input, bad option, failed fairseq-preprocess)."""


class PrepareUsageError(PrepareError):
    """A bad command-line argument (exit status 2)."""


# --------------------------------------------------------------------------------------------
# argument parsing
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(
            "Train a joint SentencePiece model on a local parallel corpus laid out as "
            "CORPUS_DIR/{train,valid,test}.{SRC,TGT}, encode all splits, and binarize them "
            "with fairseq-preprocess into OUT/bin (one joined dictionary, or with --separate-dicts "
            "one dictionary per side)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("corpus_dir", type=Path,
                   help="directory holding {train,valid,test}.{SRC,TGT} plain-text files")
    p.add_argument("--src", required=True, help="source language suffix, e.g. de")
    p.add_argument("--tgt", required=True, help="target language suffix, e.g. en")
    p.add_argument("--out", "-o", required=True, type=Path,
                   help="output directory (gets spm/, bin/ and prepare_corpus.json)")
    p.add_argument("--vocab-size", type=int_at_least(2), default=6000,
                   help="SentencePiece vocabulary size (joint for SRC and TGT)")
    p.add_argument("--separate-dicts", action="store_true",
                   help="build separate source and target fairseq dictionaries (each from its own "
                        "side of the encoded training text; the SentencePiece model stays joint), as "
                        "in the authors' IWSLT setup: train with --share-decoder-input-output-embed, "
                        "not --share-all-embeddings (which needs the default joined dictionary)")
    p.add_argument("--model-type", default="unigram", choices=["unigram", "bpe", "char", "word"],
                   help="SentencePiece model type")
    p.add_argument("--character-coverage", type=float_in(0.0, 1.0, low_open=True), default=1.0,
                   help="SentencePiece character coverage (1.0 keeps every character seen in train)")
    p.add_argument("--input-sentence-size", type=int_at_least(1), default=2_000_000,
                   help="at most this many training sentences (SRC+TGT) are sampled by the "
                        "SentencePiece trainer; 0 means use all")
    p.add_argument("--soft-vocab-limit", action="store_true",
                   help="treat --vocab-size as a soft limit (SentencePiece hard_vocab_limit=false); "
                        "useful for tiny corpora that cannot fill the requested vocabulary")
    p.add_argument("--max-train-lines", type=int_at_least(1), default=None,
                   help="use only the first N training pairs (for quick tests); valid/test are "
                        "always used in full")
    p.add_argument("--workers", type=int_at_least(1), default=max(1, min(4, os.cpu_count() or 1)),
                   help="threads for SentencePiece encoding and worker processes for fairseq-preprocess "
                        "(the output does not depend on it)")
    p.add_argument("--spm-threads", type=int_at_least(1), default=2,
                   help="threads of SentencePiece training; the learned model depends on this number "
                        "(another thread count can give another vocabulary), so it is fixed rather than taken "
                        "from the machine: the same corpus and options give the same data-bin everywhere; "
                        "2 reproduces the data-bins the documented runs used")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the prepared data (or a partial build) in OUT; the old data stays until the "
                        "new build has succeeded")
    p.add_argument("--quiet", action="store_true", help="only log warnings and errors")
    return p


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def split_path(directory: Path, split: str, lang: str) -> Path:
    return directory / f"{split}.{lang}"


def check_inputs(corpus_dir: Path, src: str, tgt: str) -> dict:
    """Check that every split exists for both languages and is line-aligned.

    Returns ``{split: n_lines}``; raises :class:`PrepareError` with every problem found.
    """
    if not corpus_dir.is_dir():
        raise PrepareError(f"corpus directory not found: {corpus_dir}")
    if src == tgt:
        raise PrepareError(f"--src and --tgt must differ (both are {src!r})")
    missing = [str(split_path(corpus_dir, s, lang)) for s in SPLITS for lang in (src, tgt)
               if not split_path(corpus_dir, s, lang).is_file()]
    if missing:
        raise PrepareError(
            "missing input file(s):\n  " + "\n  ".join(missing)
            + f"\nexpected layout: {corpus_dir}/{{train,valid,test}}.{{{src},{tgt}}}"
        )
    counts = {}
    problems = []
    for split in SPLITS:
        n_src = count_utf8_lines(split_path(corpus_dir, split, src))
        n_tgt = count_utf8_lines(split_path(corpus_dir, split, tgt))
        if n_src != n_tgt:
            problems.append(f"{split}: {n_src} lines in .{src} but {n_tgt} lines in .{tgt}")
        elif n_src == 0:
            problems.append(f"{split}: files are empty")
        counts[split] = n_src
    if problems:
        raise PrepareError("input files are not usable:\n  " + "\n  ".join(problems))
    return counts


def count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        for _ in f:
            n += 1
    return n


def count_utf8_lines(path: Path) -> int:
    """Number of lines of ``path``; raises :class:`PrepareError` naming the first line that is not UTF-8
    (SentencePiece and fairseq would otherwise fail later with a decoding traceback)."""
    problem = utf8_problem(path)
    if problem:
        raise PrepareError(f"{path}, {problem}; the corpus must be UTF-8 text (convert it first, e.g. "
                           "iconv -f latin1 -t utf-8)")
    return count_lines(path)


def read_lines(path: Path, limit: Optional[int] = None) -> Iterator[str]:
    """Yield lines without the trailing newline (at most ``limit`` lines)."""
    with open(path, encoding="utf-8", newline="\n") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            yield line.rstrip("\r\n")


def chunks(items: Iterable[str], size: int) -> Iterator[List[str]]:
    buf: List[str] = []
    for item in items:
        buf.append(item)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf


# --------------------------------------------------------------------------------------------
# steps
# --------------------------------------------------------------------------------------------


def train_spm(args, spm_dir: Path) -> Path:
    """Train the joint SentencePiece model on train SRC + TGT; returns the .model path."""
    import sentencepiece as spm

    limit = args.max_train_lines

    def sentences() -> Iterator[str]:
        for lang in (args.src, args.tgt):
            for line in read_lines(split_path(args.corpus_dir, "train", lang), limit):
                if line.strip():
                    yield line

    prefix = spm_dir / SPM_PREFIX
    log_path = spm_dir / "spm_train.log"
    logger.info(
        "training SentencePiece (%s, vocab %d, character coverage %g, %d threads) -> %s.model",
        args.model_type, args.vocab_size, args.character_coverage, args.spm_threads, prefix,
    )
    t0 = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=sentences(),
                model_prefix=str(prefix),
                vocab_size=args.vocab_size,
                model_type=args.model_type,
                character_coverage=args.character_coverage,
                input_sentence_size=args.input_sentence_size,
                shuffle_input_sentence=True,
                hard_vocab_limit=not args.soft_vocab_limit,
                num_threads=args.spm_threads,
                logstream=log,
            )
        except RuntimeError as exc:  # sentencepiece reports bad settings as RuntimeError
            raise PrepareError(
                f"SentencePiece training failed: {exc}\n(for a tiny corpus try a smaller --vocab-size or "
                "--soft-vocab-limit)"
            ) from exc
    logger.info("SentencePiece trained in %.1fs (log: %s)", time.time() - t0, log_path)
    return prefix.with_suffix(".model")


def encode_splits(args, model_path: Path, spm_dir: Path) -> dict:
    """Encode every split with the model; returns {split: n_lines}."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_path))
    counts = {}
    for split in SPLITS:
        limit = args.max_train_lines if split == "train" else None
        for lang in (args.src, args.tgt):
            src_path = split_path(args.corpus_dir, split, lang)
            dst_path = split_path(spm_dir, split, lang)
            n = 0
            with open(dst_path, "w", encoding="utf-8", newline="\n") as out:
                for batch in chunks(read_lines(src_path, limit), ENCODE_CHUNK):
                    for pieces in sp.encode(batch, out_type=str, num_threads=args.workers):
                        out.write(" ".join(pieces) + "\n")
                    n += len(batch)
            logger.info("encoded %s -> %s (%d lines)", src_path, dst_path, n)
            counts[split] = n
    return counts


def preprocess_arguments(args, spm_dir: Path, bin_dir: Path) -> List[str]:
    """The fairseq-preprocess command line (without the program name).

    Without ``--joined-dictionary`` fairseq-preprocess builds dict.SRC.txt from train.SRC and
    dict.TGT.txt from train.TGT (every piece seen, no threshold), which is what --separate-dicts means.
    """
    argv = [
        "--source-lang", args.src,
        "--target-lang", args.tgt,
        "--trainpref", str(spm_dir / "train"),
        "--validpref", str(spm_dir / "valid"),
        "--testpref", str(spm_dir / "test"),
        "--destdir", str(bin_dir),
        *([] if args.separate_dicts else ["--joined-dictionary"]),
        "--workers", str(args.workers),
    ]
    return argv


def run_preprocess(args, spm_dir: Path, bin_dir: Path) -> None:
    # In this process: fairseq-preprocess as a subprocess would import torch and fairseq a second time.
    argv = preprocess_arguments(args, spm_dir, bin_dir)
    # the whole command holds every path: one short line here, the command at the debug level
    logger.info("binarizing with fairseq-preprocess into %s", bin_dir)
    logger.debug("fairseq-preprocess %s", " ".join(argv))
    t0 = time.time()
    try:
        from fairseq import options
        from fairseq_cli import preprocess
    except ImportError as e:
        raise PrepareError(f"fairseq is not importable ({e}); install it with pip install -e .[fairseq]") from e
    # fairseq-preprocess adds a FileHandler (OUT/bin/preprocess.log) to its logger: detach it afterwards.
    plog = logging.getLogger("fairseq_cli.preprocess")
    handlers = list(plog.handlers)
    parent = os.getpid()

    def on_sigint(signum, frame):
        # fairseq-preprocess forks worker processes, which inherit this handler: a Ctrl-C reaches the
        # whole process group, and only this process should stop (the workers end with it), without
        # one KeyboardInterrupt traceback per worker.
        if os.getpid() != parent:
            os._exit(130)
        raise KeyboardInterrupt

    try:
        sigint = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread
        sigint = None
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args(argv))
    except SystemExit as e:
        raise PrepareError(f"fairseq-preprocess rejected its arguments (exit {e.code}): {' '.join(argv)}") from e
    except Exception as e:  # noqa: BLE001 - reported to the user with the cause
        raise PrepareError(f"fairseq-preprocess failed: {type(e).__name__}: {e}") from e
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)
        for h in plog.handlers[:]:
            if h not in handlers:
                plog.removeHandler(h)
                h.close()
    logger.info("fairseq-preprocess finished in %.1fs", time.time() - t0)


def dict_size(path: Path) -> int:
    """Number of entries in a fairseq dict file plus the 4 special symbols."""
    return count_lines(path) + 4


def prepare(args) -> dict:
    t_start = time.time()
    if args.vocab_size < 2:
        raise PrepareError("--vocab-size must be at least 2")
    if args.max_train_lines is not None and args.max_train_lines < 1:
        raise PrepareError("--max-train-lines must be positive")
    if args.spm_threads < 1:
        raise PrepareError("--spm-threads must be positive")
    if args.workers < 1:
        raise PrepareError("--workers must be positive")

    input_counts = check_inputs(args.corpus_dir, args.src, args.tgt)
    logger.info("input %s: %s", args.corpus_dir,
                ", ".join(f"{k} {v}" for k, v in input_counts.items()))

    out: Path = args.out
    check_out_path(out, corpus_dir=args.corpus_dir)
    try:  # one build per OUT at a time: a second one would take this one's live partial build for a dead one's
        with folder_lock(out, flag="--out", command=COMMAND):
            summary = build_locked(args, out, t_start)
    except FolderBusy as e:
        raise PrepareError(str(e)) from None
    sizes = summary["fairseq_dict_sizes"]
    logger.info(
        "done in %.1fs: data-bin %s | spm vocab %d | fairseq %s dict %s | lines %s",
        summary["seconds"]["total"], out / "bin", args.vocab_size, summary["dictionaries"],
        sizes[args.src] if not args.separate_dicts else f"{args.src} {sizes[args.src]}, {args.tgt} {sizes[args.tgt]}",
        ", ".join(f"{k} {v}" for k, v in summary["lines"].items()),
    )
    return summary


def build_locked(args, out: Path, t_start: float) -> dict:
    """Build into a fresh staging folder and move it into ``out`` (locked by the caller)."""
    stage = check_out(out, overwrite=args.overwrite, corpus_dir=args.corpus_dir)
    try:
        summary = build(args, stage, out, t_start)
        swap_in(stage, out)
    except BaseException:
        # Whatever stopped the build (an error, Ctrl-C), OUT keeps what it held before.
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return summary


def staging_dir(out: Path) -> Path:
    """Where a build is made before it replaces OUT's contents (beside OUT: same file system)."""
    out = out.resolve()
    return out.parent / f".{out.name}.partial"


def check_out_path(out: Path, *, corpus_dir: Optional[Path] = None) -> None:
    """Refuse an ``--out`` that is a file, below one, or whose replaced parts hold the corpus."""
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise PrepareUsageError(f"--out {out}: {existing} is an existing file, not a folder; give a folder path")
    try:  # what --overwrite replaces must not hold the corpus
        check_output("--out", out, FOLDER, inputs={"corpus_dir": corpus_dir}, writes=("spm", "bin", SUMMARY))
    except OutputError as e:
        raise PrepareUsageError(str(e)) from None


def check_out(out: Path, *, overwrite: bool, corpus_dir: Optional[Path] = None) -> Path:
    """Refuse an unusable ``--out`` (its lock held: no other build is running into it); returns a fresh,
    empty staging folder."""
    check_out_path(out, corpus_dir=corpus_dir)
    if (out / SUMMARY).is_file() and not overwrite:
        raise PrepareError(f"{out} already holds prepared data ({SUMMARY}); pass --overwrite to replace it")
    partial = [name for name in ("spm", "bin") if (out / name).exists()]
    if partial and not (out / SUMMARY).is_file() and not overwrite:
        raise PrepareError(
            f"{out} holds a partial build ({' and '.join(n + '/' for n in partial)} without {SUMMARY}, left by an "
            "interrupted or failed run); pass --overwrite to replace it")
    stage = staging_dir(out)
    if stage.exists():
        shutil.rmtree(stage)
        logger.info("removed %s, a partial build left by an interrupted run", stage)
    stage.mkdir(parents=True)
    return stage


def swap_in(stage: Path, out: Path) -> None:
    """Move the finished build from ``stage`` into ``out``; the summary goes last, so that OUT never
    holds a summary of data that is not there. Ctrl-C is ignored for these few renames."""
    try:
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals go to the main thread anyway
        handler = None
    try:
        move_outputs(stage, out)
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


def move_outputs(stage: Path, out: Path) -> None:
    if not out.exists():
        os.replace(stage, out)
        return
    old = stage.parent / f".{out.resolve().name}.replaced"
    shutil.rmtree(old, ignore_errors=True)
    old.mkdir()
    for name in (SUMMARY, "spm", "bin"):
        if (out / name).exists():
            os.replace(out / name, old / name)
    for name in ("spm", "bin", SUMMARY):
        os.replace(stage / name, out / name)
    shutil.rmtree(old)
    stage.rmdir()


def build(args, stage: Path, out: Path, t_start: float) -> dict:
    """Train, encode and binarize into ``stage``; the summary names the final paths under ``out``."""
    spm_dir, bin_dir = stage / "spm", stage / "bin"
    spm_dir.mkdir()
    bin_dir.mkdir()

    t0 = time.time()
    model_path = train_spm(args, spm_dir)
    t_spm = time.time() - t0

    t0 = time.time()
    counts = encode_splits(args, model_path, spm_dir)
    t_encode = time.time() - t0

    t0 = time.time()
    run_preprocess(args, spm_dir, bin_dir)
    t_bin = time.time() - t0

    for suffix in (".model", ".vocab"):
        shutil.copy2(model_path.with_suffix(suffix), bin_dir / (SPM_PREFIX + suffix))

    dict_src, dict_tgt = bin_dir / f"dict.{args.src}.txt", bin_dir / f"dict.{args.tgt}.txt"
    expected = [dict_src, dict_tgt] + [
        bin_dir / f"{split}.{args.src}-{args.tgt}.{lang}.{ext}"
        for split in SPLITS for lang in (args.src, args.tgt) for ext in ("bin", "idx")
    ]
    absent = [str(p) for p in expected if not p.is_file()]
    if absent:
        raise PrepareError("fairseq-preprocess did not produce:\n  " + "\n  ".join(absent))

    summary = {
        "corpus_dir": str(args.corpus_dir.resolve()),
        "src": args.src,
        "tgt": args.tgt,
        "out": str(out.resolve()),
        "data_bin": str((out / "bin").resolve()),
        "spm_model": str((out / "bin" / (SPM_PREFIX + ".model")).resolve()),
        "spm_model_type": args.model_type,
        "spm_vocab_size": args.vocab_size,
        "spm_threads": args.spm_threads,
        "character_coverage": args.character_coverage,
        "dictionaries": "separate" if args.separate_dicts else "joint",
        # source dictionary size (both sides' size when joint); kept for readers of older summaries
        "fairseq_dict_size": dict_size(dict_src),
        "fairseq_dict_sizes": {args.src: dict_size(dict_src), args.tgt: dict_size(dict_tgt)},
        "max_train_lines": args.max_train_lines,
        "lines": counts,
        "seconds": {
            "spm_train": round(t_spm, 2),
            "encode": round(t_encode, 2),
            "binarize": round(t_bin, 2),
            "total": round(time.time() - t_start, 2),
        },
    }
    write_json(stage / SUMMARY, summary, command=COMMAND, indent=2)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    try:
        prepare(args)
    except PrepareUsageError as exc:
        logger.error("%s", exc)
        return 2
    except PrepareError as exc:
        logger.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        logger.error("interrupted (Ctrl-C): %s was left as it was and the partial build was removed; run the "
                     "same command again to prepare the data", args.out)
        return 130
    return 0


run = quiet_command(main, COMMAND)


if __name__ == "__main__":
    sys.exit(run())
