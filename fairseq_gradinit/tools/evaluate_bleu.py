#!/usr/bin/env python3
"""Translate a binarized split as fairseq-generate does, in this process, and score it with sacreBLEU.

The decode is the one of the command::

    python -m fairseq_gradinit.tools.host_generate DATA --path CKPT --gen-subset SUBSET --beam 5 \\
        --remove-bpe sentencepiece --max-tokens N [--batch-size B] [--user-dir D] [--cpu] \\
        --num-workers 0 [EXTRA...]

(fairseq-generate, with token strings built from host lists: :mod:`.host_generate`), run through fairseq's
Python API in this process (:mod:`.inprocess_generate`): fairseq's generation parser reads those arguments,
the task is set up, the ensemble loaded onto it, the split batched by the task's iterator and decoded by the
task's sequence generator. The hypotheses (fairseq-generate's ``H`` strings, which ``--remove-bpe
sentencepiece`` has already turned back into plain text) and the references (its ``T`` strings) are scored
with ``sacrebleu.metrics.BLEU`` (13a tokenization by default). A JSON file with the score, its signature and
the run details (``generate_command``: the command above, which prints the same hypotheses) is written, and
a one-line summary is printed.

Everything after ``--`` is passed unchanged to fairseq-generate's arguments, e.g.::

    python scripts/evaluate_bleu.py data-bin/debian-ui-de-en/bin \\
        --path checkpoints/run1/checkpoint_best.pt --cpu -- --lenpen 1.0 --nbest 1

``--ref FILE`` scores against a raw reference file (line i = sample id i) instead of the ``T-``
lines, which come from the binarized data (SentencePiece-normalized, unknown words as
``<<unk>>``). The file is compared with the ``T-`` lines (letters and digits, lowercased) and
refused when more than half of them differ (the target file of another split). ``--from-output FILE`` scores
a saved fairseq-generate output (``--save-output`` writes the decode's lines as fairseq-generate prints them)
without decoding.

On a CUDA GPU the batches are larger (``--max-tokens 65536``, up to 4096 sentences) and ``--fp16`` decodes in
half precision (fairseq-generate ``--fp16``; asked for when the model trained in fp16). On the CPU ``--fp16`` is
ignored with a note (fairseq's CPU decoding is fp32). The decode rate is measured while decoding (sentences and
source tokens per second since the start-up, loading the model and the split, ended), logged once the batches
holding the first ``--rate-chunk`` sentences are out and then every few seconds, written to ``--progress-json``
and kept in the result's ``decode`` block; with ``--time-limit S`` the decode stops as soon as that rate projects
a total beyond S seconds (or at S), and the result file says so, with the rate.

``--required-batch-size-multiple 1`` is added unless given after ``--``: with fairseq's default
of 8 the last batch is dropped when its size is not a multiple of 8, so a few test sentences
would silently go untranslated. The number of hypotheses is also checked against the size of
the binarized subset.

fairseq 0.12.3 cannot load its checkpoints under torch >= 2.6 (``torch.load`` now defaults to
``weights_only=True``); the plugin, which the decode loads as fairseq-generate's ``--user-dir`` would, lets
fairseq load them with ``weights_only=False`` (only evaluate checkpoints you trust).
"""

from __future__ import annotations

import argparse
import html
import os
import re
import signal
import sys
import threading
import time
import traceback
import unicodedata
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..argtypes import positive_int
from ..checkpoints import load_trusted_checkpoint
from ..paths import (
    OutputError,
    check_output,
    header_line,
    json_result,
    text_lines,
    text_output,
    utf8_problem,
    write_json,
)
from ..quiet import quiet_command

#: The installed package, fairseq's ``--user-dir`` for this plugin.
COMMAND = "gradinit-evaluate-bleu"
GRADINIT_USER_DIR = Path(__file__).resolve().parents[1]

_HYP_RE = re.compile(r"^H-(\d+)\t")
_REF_RE = re.compile(r"^T-(\d+)\t")
_SRC_RE = re.compile(r"^S-(\d+)\t")
_TRANSLATED_RE = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s"
)
_FAIRSEQ_BLEU_RE = re.compile(r"^Generate (\S+) with beam=(\d+): (.*)$")


class EvaluationError(RuntimeError):
    """A user-facing error (failed generation, unusable output)."""


class ArgumentProblem(ValueError):
    """A bad command-line value, reported as argparse reports its own (exit status 2)."""


# --------------------------------------------------------------------------------------------
# parsing and scoring (pure functions, unit-tested without fairseq)
# --------------------------------------------------------------------------------------------


@dataclass
class GenerateOutput:
    hypotheses: Dict[int, str] = field(default_factory=dict)  # best (first) hypothesis per id
    references: Dict[int, str] = field(default_factory=dict)
    sources: Dict[int, str] = field(default_factory=dict)
    translate_seconds: Optional[float] = None  # from fairseq's "Translated ... in Xs" line
    n_translated: Optional[int] = None
    fairseq_bleu: Optional[str] = None  # fairseq's own "Generate ... with beam=N: ..." result
    subset: Optional[str] = None  # from that line
    beam: Optional[int] = None  # from that line

    def add(self, sentence) -> None:
        """A sentence decoded in this process (:class:`~.inprocess_generate.DecodedSentence`), as its lines read."""
        if sentence.hypotheses:
            self.hypotheses.setdefault(sentence.id, sentence.hypotheses[0].text)
        if sentence.reference is not None:
            self.references[sentence.id] = sentence.reference
        if sentence.source is not None:
            self.sources[sentence.id] = sentence.source

    def finish(self, decoder) -> None:
        """The whole decode's numbers from ``decoder`` (:class:`~.inprocess_generate.SplitDecoder`), as its
        timing and BLEU lines read (the time to fairseq's tenth of a second)."""
        self.n_translated = decoder.n_translated
        self.translate_seconds = round(decoder.translate_seconds, 1)
        self.fairseq_bleu = decoder.fairseq_bleu()
        if self.fairseq_bleu is not None:
            self.subset, self.beam = decoder.cfg.dataset.gen_subset, decoder.cfg.generation.beam


def parse_generate_output(lines: Iterable[str]) -> GenerateOutput:
    """Parse fairseq-generate's output (a file saved with ``--save-output``, or printed by fairseq-generate).

    ``H-<id>\\t<score>\\t<text>`` and ``T-<id>\\t<text>`` lines are collected (the text may be
    empty). With ``--nbest > 1`` only the first ``H`` line per id (the best one) is kept. Log
    lines and the ``D-``/``P-`` lines are ignored except for the "Translated N sentences ... in
    Xs" timing line and fairseq's own BLEU line.
    """
    out = GenerateOutput()
    for raw in lines:
        line = raw.rstrip("\r\n")
        m = _HYP_RE.match(line)
        if m:
            parts = line.split("\t", 2)
            text = parts[2] if len(parts) == 3 else ""
            out.hypotheses.setdefault(int(m.group(1)), text)
            continue
        m = _REF_RE.match(line)
        if m:
            out.references[int(m.group(1))] = line.split("\t", 1)[1]
            continue
        m = _SRC_RE.match(line)
        if m:
            out.sources[int(m.group(1))] = line.split("\t", 1)[1]
            continue
        m = _TRANSLATED_RE.search(line)
        if m:
            out.n_translated = int(m.group(1).replace(",", ""))
            out.translate_seconds = float(m.group(3))
            continue
        m = _FAIRSEQ_BLEU_RE.match(line)
        if m:
            out.subset, out.beam, out.fairseq_bleu = m.group(1), int(m.group(2)), m.group(3)
    return out


def read_reference_file(path: Path) -> List[str]:
    """The lines of ``--ref``, split at line feeds only (:func:`~fairseq_gradinit.paths.text_lines`): a lone
    CR inside a sentence stays in it instead of splitting it and shifting every later reference."""
    return text_lines(path)


def comparable(text: str) -> str:
    """``text`` reduced to what survives SentencePiece normalization and (de)tokenization: HTML
    entities (Moses escapes) decoded, NFKC, lowercased, letters and digits only."""
    return "".join(c for c in unicodedata.normalize("NFKC", html.unescape(text)).lower() if c.isalnum())


def same_reference(file_line: str, t_line: str) -> bool:
    """Whether a ``--ref`` line is the ``T-`` line's sentence; each ``<<unk>>`` stands for any text."""
    pieces = [re.escape(comparable(p)) for p in t_line.split("<<unk>>")]
    return re.fullmatch(".*".join(pieces), comparable(file_line)) is not None


def reference_mismatch(parsed: GenerateOutput, reference_lines: Sequence[str]) -> Optional[str]:
    """Why ``reference_lines`` (``--ref``) are not the references of the generated subset, or None.

    Compares them with the ``T-`` lines that fairseq-generate printed: a reference file of
    another split or language matches almost none of them.
    """
    pairs = [(i, t) for i, t in sorted(parsed.references.items())
             if i < len(reference_lines) and comparable(t.replace("<<unk>>", ""))]
    if not pairs:
        return None
    differ = [(i, t) for i, t in pairs if not same_reference(reference_lines[i], t)]
    if 2 * len(differ) <= len(pairs):
        return None
    i, t = differ[0]
    return (f"{len(differ)} of {len(pairs)} lines differ from the references in the binarized subset (e.g. "
            f"sample {i}: the file has {reference_lines[i][:60]!r}, the subset {t[:60]!r}); pass the "
            "plain-text target file of the split given as --gen-subset")


def pair_up(
    parsed: GenerateOutput, reference_lines: Optional[Sequence[str]] = None
) -> Tuple[List[int], List[str], List[str]]:
    """Return (ids, hypotheses, references) sorted by sample id.

    References come from the ``T-`` lines, or from ``reference_lines`` (line i = sample id i)
    when given. Raises :class:`EvaluationError` if nothing was generated or ids do not match.
    """
    if not parsed.hypotheses:
        raise EvaluationError("no H-<id> lines found in the fairseq-generate output")
    ids = sorted(parsed.hypotheses)
    if reference_lines is not None:
        out_of_range = [i for i in ids if i >= len(reference_lines)]
        if out_of_range:
            raise EvaluationError(
                f"reference file has {len(reference_lines)} lines but the output has sample "
                f"ids up to {max(out_of_range)}"
            )
        refs = [reference_lines[i] for i in ids]
    else:
        missing = [i for i in ids if i not in parsed.references]
        if missing:
            raise EvaluationError(
                f"{len(missing)} hypotheses have no T-<id> reference line (e.g. id {missing[0]}); "
                "is the subset missing its target side? Use --ref FILE."
            )
        extra = set(parsed.references) - set(ids)
        if extra:
            raise EvaluationError(
                f"{len(extra)} references have no hypothesis (e.g. id {min(extra)})"
            )
        refs = [parsed.references[i] for i in ids]
    return ids, [parsed.hypotheses[i] for i in ids], refs


def score_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str],
    tokenize: Optional[str] = None,
    lowercase: bool = False,
) -> dict:
    """Corpus BLEU with sacreBLEU; returns score, signature and the statistics."""
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise EvaluationError(
            f"{len(hypotheses)} hypotheses but {len(references)} references"
        )
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase)
    result = bleu.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": round(result.score, 4),
        "signature": str(bleu.get_signature()),
        "bleu_string": str(result),
        "precisions": [round(p, 4) for p in result.precisions],
        "brevity_penalty": round(result.bp, 4),
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
    }


def scoring_problem(tokenize: Optional[str], lowercase: bool) -> Optional[str]:
    """Why sacreBLEU cannot score with ``--tokenize``/``--lowercase`` (a tokenizer it does not have, or one whose
    extra dependencies are missing), found by scoring one sentence before any decoding; None when it scores."""
    from sacrebleu.metrics import BLEU

    try:
        score_bleu(["a b c d"], ["a b c d"], tokenize=tokenize, lowercase=lowercase)
    except KeyError:
        return (f"argument --tokenize: sacreBLEU has no tokenizer {tokenize!r}; choose one of "
                f"{', '.join(getattr(BLEU, 'TOKENIZERS', ()))}")
    except Exception as e:  # noqa: BLE001 - sacreBLEU's own reasons (RuntimeError, ImportError), on one line
        return f"argument --tokenize: sacreBLEU cannot tokenize with {tokenize!r}: {' '.join(str(e).split())}"
    return None


def format_summary(result: dict) -> str:
    wall = result.get("generation_wall_time_s")
    wall_s = f"{wall:.1f}s" if isinstance(wall, (int, float)) else "n/a"
    return (
        f"BLEU {result['bleu']:.2f} | {result['subset']} | beam {result['beam']} | "
        f"{result['n_sentences']} sents ({result.get('distinct_hypotheses', '?')} distinct hypotheses) | "
        f"gen {wall_s} | {result['checkpoint']} | "
        f"{result['signature']}"
    )


# --------------------------------------------------------------------------------------------
# decoding (fairseq-generate's decode, in this process)
# --------------------------------------------------------------------------------------------


def resolve_user_dir(value: str) -> Path:
    """The ``--user-dir`` folder: 'gradinit', or the path fairseq-train took (``fairseq_gradinit``,
    relative to the current folder or not), means this repository's package."""
    path = Path(value)
    if value == "gradinit" or (path.name == "fairseq_gradinit" and not path.is_dir()):
        return GRADINIT_USER_DIR
    if not path.is_dir():
        raise ArgumentProblem(f"argument --user-dir: {value} is not a directory: pass the --user-dir the model "
                              "was trained with (fairseq_gradinit for this plugin)")
    return path.resolve()


def data_subsets(data: Path) -> List[str]:
    """The binarized splits in ``data`` (from the names of its ``.idx``/``.bin`` files)."""
    names = {f.name.split(".", 1)[0] for f in data.iterdir() if f.suffix in (".idx", ".bin")}
    return sorted(names)


def check_inputs(args) -> None:
    """Refuse a data folder that is no data-bin, a split it lacks and a damaged checkpoint before
    fairseq-generate loads anything (``ArgumentProblem``)."""
    data = Path(args.data)
    if not data.is_dir():
        raise ArgumentProblem(f"argument data: {data} is not a directory")
    if not any(data.glob("dict.*.txt")):
        inner = [d for d in sorted(data.iterdir()) if d.is_dir() and any(d.glob("dict.*.txt"))]
        hint = (f"its subfolder {inner[0]} is one: pass {inner[0]}" if inner else
                "pass the folder fairseq-preprocess (or prepare_corpus.py's bin/) wrote")
        raise ArgumentProblem(f"argument data: {data} holds no fairseq data-bin (no dict.*.txt); {hint}")
    subsets = data_subsets(data)
    if args.gen_subset not in subsets:
        raise ArgumentProblem(f"argument --gen-subset: invalid choice {args.gen_subset!r}: {data} holds "
                              f"{', '.join(subsets) or 'no binarized split'}")
    path = Path(args.path)
    if not path.is_file():
        raise ArgumentProblem(f"argument --path: {path}: no such checkpoint file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if not magic:
        raise ArgumentProblem(f"argument --path: {path} is empty: pick another checkpoint")
    if magic == b"PK\x03\x04":  # torch.save's zip format: a cut-off file has no central directory
        try:
            with zipfile.ZipFile(path) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise ArgumentProblem(f"argument --path: {path} is truncated or damaged ({e}): pick another "
                                  "checkpoint, e.g. an earlier checkpoint_*.pt of the same run") from None
    if subset_size(data, args.gen_subset) == 0:
        raise ArgumentProblem(f"argument --gen-subset: the split {args.gen_subset!r} of {data} has no sentences: "
                              "there is nothing to translate; pick another split")
    if not args.user_dir:
        need = plugin_need(path)
        if need:
            raise ArgumentProblem(f"argument --path: {path} was trained with the fairseq_gradinit plugin ({need}), "
                                  "which fairseq-generate needs to load it: add --user-dir fairseq_gradinit")


#: Architectures the plugin registers (a checkpoint of one needs it to load).
PLUGIN_ARCHS = ("transformer_wskip", "transformer_lm_postln")


def plugin_need(path: Path) -> Optional[str]:
    """What in the checkpoint ``path`` only loads with the fairseq_gradinit plugin (its task, its
    per-use multipliers, one of its architectures), or None. The tensors are memory-mapped, not read."""
    try:
        state = load_trusted_checkpoint(path, map_location="cpu", mmap=True)
    except Exception:  # an old format, or a pickle fairseq cannot read: fairseq-generate will say
        return None
    def get(obj, key):  # fairseq saves its config as a dict (or an omegaconf/argparse object)
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    if not isinstance(state, dict):
        return None
    cfg = state.get("cfg") or state.get("args")
    name = str(get(get(cfg, "task"), "_name") or get(cfg, "task") or "")
    if name == "translation_gradinit":
        return "its task is translation_gradinit"
    multipliers = sorted(k for k in (state.get("model") or {}) if k.endswith("embed_scale"))
    if multipliers:
        return f"it holds per-use scales of tied embeddings ({', '.join(multipliers)})"
    model = get(cfg, "model")
    arch = str(get(model, "_name") or get(model, "arch") or get(cfg, "arch") or "")
    if arch.startswith(PLUGIN_ARCHS):
        return f"its architecture {arch} is the plugin's"
    return None


def reference_problem(ref: Path, data: Optional[Path], subset: str) -> Optional[str]:
    """Why ``ref`` cannot be the plain-text references of the split ``subset`` of ``data``: unreadable,
    not UTF-8, or not one line per sentence of the split (line i is sentence i); None when it may be."""
    if not ref.is_file():
        return f"{ref} is not a file" if ref.exists() else f"{ref}: no such file"
    problem = utf8_problem(ref)
    if problem:
        return f"{ref}, {problem}; the references must be UTF-8 text (convert them, e.g. iconv -f latin1 -t utf-8)"
    expected = subset_size(data, subset) if data is not None and Path(data).is_dir() else None
    if expected is not None:
        n = len(read_reference_file(ref))
        if n != expected:
            return (f"{ref} has {n} lines, but the split {subset!r} of {data} has {expected} sentences: line i of the "
                    "references must be sentence i of the split; pass the plain-text target file of that split")
    return None


def option_value(argv: Sequence[str], *names: str) -> Optional[str]:
    """The last value of one of the options ``names`` in ``argv`` (as argparse takes it), or None."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name:  # fairseq's --remove-bpe alone means subword_nmt
                value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "subword_nmt"
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1:]
    return value


def binarized_references(data: Path, subset: str, cmd: Sequence[str]) -> Optional[List[str]]:
    """The target side of the split ``subset`` of ``data`` as the decode's ``T-`` lines read (the target
    dictionary's strings, unknown words as ``<<unk>>``, the command's ``--remove-bpe``/``--post-process``), for
    the language pair the command names or fairseq infers from the folder; None where that cannot be read here
    (no such pair, another format, a ``--bpe``/``--tokenizer`` decoder given to fairseq-generate)."""
    from fairseq.data import Dictionary, data_utils
    from fairseq.data.indexed_dataset import MMapIndexedDataset, infer_dataset_impl

    if option_value(cmd, "--bpe") or option_value(cmd, "--tokenizer"):
        return None
    src, tgt = option_value(cmd, "--source-lang", "-s"), option_value(cmd, "--target-lang", "-t")
    if src is None or tgt is None:
        src, tgt = data_utils.infer_language_pair(str(data))
    if src is None or tgt is None:
        return None
    post_process = option_value(cmd, "--post-process", "--remove-bpe")
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        prefix = str(Path(data) / f"{subset}.{pair}.{tgt}")
        dictionary = Path(data) / f"dict.{tgt}.txt"
        if not Path(prefix + ".idx").is_file() or not dictionary.is_file():
            continue
        try:
            if infer_dataset_impl(prefix) != "mmap":
                return None
            tokens = MMapIndexedDataset(prefix)
            target = Dictionary.load(str(dictionary))
            return [target.string(tokens[i].tolist(), post_process, escape_unk=True) for i in range(len(tokens))]
        except (OSError, AssertionError, ValueError, KeyError, IndexError, NotImplementedError):
            return None  # a damaged split: fairseq-generate says what is wrong with it
    return None


def binarized_reference_problem(ref: Path, data: Path, subset: str, cmd: Sequence[str]) -> Optional[str]:
    """Which line of ``ref`` is not the sentence of the split ``subset`` of ``data`` at its place (a line lost and
    another added keep the count but shift every line between them), or None; each ``<<unk>>`` of the binarized
    side stands for any text (:func:`same_reference`)."""
    binarized = binarized_references(data, subset, cmd)
    if binarized is None:
        return None
    lines = read_reference_file(ref)
    for i, (line, t_line) in enumerate(zip(lines, binarized)):
        if not same_reference(line, t_line):
            return (f"line {i + 1} of {ref} is not sentence {i} of the split {subset!r} of {data} (the file has "
                    f"{line[:60]!r}, the split {t_line[:60]!r}): line i of the references must be sentence i of the "
                    "split; pass the plain-text target file of that split")
    return None


def check_paths(args) -> None:
    """Before any work: sacreBLEU scores with ``--tokenize``/``--lowercase``, the files read are readable text,
    ``--ref`` has one line per sentence of the split (when the split is translated here), and no file written is
    an input or a file of another kind (``ArgumentProblem``)."""
    problem = scoring_problem(args.tokenize, args.lowercase)
    if problem:
        raise ArgumentProblem(problem)
    if args.ref is not None:
        problem = reference_problem(args.ref, None if args.from_output is not None else args.data, args.gen_subset)
        if problem:
            raise ArgumentProblem(f"argument --ref: {problem}")
    if args.from_output is not None and args.from_output.is_file():
        problem = utf8_problem(args.from_output)
        if problem:
            raise ArgumentProblem(f"argument --from-output: {args.from_output}, {problem}; give the text that "
                                  "fairseq-generate printed (saved with --save-output)")
    inputs = {"data": args.data, "--path": args.path, "--ref": args.ref, "--from-output": args.from_output}
    out_json = args.output_json
    if out_json is None and args.path is not None and args.from_output is None:
        out_json = default_json_path(args.path, args.gen_subset)
    try:
        if out_json is not None:
            check_output("--output-json", out_json, json_result("a BLEU result of gradinit-evaluate-bleu", "bleu",
                                                                command=COMMAND), inputs=inputs)
        if args.save_output is not None:
            check_output("--save-output", args.save_output,
                         text_output("fairseq-generate's output saved by gradinit-evaluate-bleu", COMMAND),
                         inputs=inputs)
        if args.progress_json is not None:
            check_output("--progress-json", args.progress_json,
                         json_result("a decode rate of gradinit-evaluate-bleu", "sentences_done", command=COMMAND),
                         inputs=inputs)
    except OutputError as e:
        raise ArgumentProblem(str(e)) from None


#: Batches on a CUDA GPU: each batch runs up to ``max-len-a * its longest source + max-len-b`` decoder
#: steps, and a step's host work (beam bookkeeping, kernel launches) hardly grows with the batch, so fewer,
#: larger batches should take fewer steps and less time. That is reasoning, not a measurement:
#: benchmarks/bench_bleu_decode.py measures it.
GPU_MAX_TOKENS = 65536
GPU_BATCH_SIZE = 4096
CPU_MAX_TOKENS = 4096
#: The batches are read in the decoding process (fairseq's default, 1 worker, forks one more process per
#: decode, which would copy this one and outlive a stop by seconds).
GENERATE_NUM_WORKERS = 0
#: The module of the fairseq-generate command the decode repeats (fairseq_cli.generate with token strings
#: built on the host): the result's ``generate_command`` prints the same hypotheses.
GENERATE_MODULE = "fairseq_gradinit.tools.host_generate"


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def decode_device(args) -> Tuple[bool, bool, Optional[str]]:
    """(on CUDA, in fp16, note): fp16 only where it was asked for and a CUDA GPU decodes."""
    cuda = not args.cpu and cuda_available()
    if args.fp16 and not cuda:
        return False, False, "--fp16 ignored: no CUDA GPU decodes here, fairseq-generate runs in fp32"
    return cuda, bool(args.fp16 and cuda), None


def build_generate_command(args, extra: Sequence[str], *, cuda: Optional[bool] = None,
                           fp16: bool = False) -> List[str]:
    """The fairseq-generate command line of the decode (its arguments, ``[3:]``, are what the decode in this process
    parses); ``cuda`` (detected when None) picks the batch defaults."""
    if cuda is None:
        cuda = not args.cpu and cuda_available()
    cmd = [
        sys.executable, "-m", getattr(args, "generate_module", None) or GENERATE_MODULE, str(args.data),
        "--path", str(args.path),
        "--gen-subset", args.gen_subset,
        "--beam", str(args.beam),
        "--remove-bpe", "sentencepiece",
    ]
    batch_size = args.batch_size
    max_tokens = args.max_tokens
    if cuda and batch_size is None and max_tokens is None:
        batch_size, max_tokens = GPU_BATCH_SIZE, GPU_MAX_TOKENS
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    if max_tokens is not None or batch_size is None:
        cmd += ["--max-tokens", str(max_tokens or CPU_MAX_TOKENS)]
    if args.user_dir:
        cmd += ["--user-dir", str(resolve_user_dir(args.user_dir))]
    if args.cpu:
        cmd.append("--cpu")
    if fp16 and "--fp16" not in extra:
        cmd.append("--fp16")
    if "--num-workers" not in extra:
        cmd += ["--num-workers", str(GENERATE_NUM_WORKERS)]
    if "--required-batch-size-multiple" not in extra:
        # fairseq 0.12 drops the last batch when its size is not a multiple of this value
        # (default 8), silently leaving up to 7 sentences untranslated (fairseq issue #5036)
        cmd += ["--required-batch-size-multiple", "1"]
    return cmd + list(extra)


def batch_settings(cmd: Sequence[str]) -> dict:
    """The batching options of a fairseq-generate command line (the last value of each, as argparse
    takes it; None where fairseq's default applies) and the intra-op threads it runs with."""
    settings = {"max_tokens": None, "batch_size": None, "num_workers": None, "required_batch_size_multiple": None}
    for i, arg in enumerate(cmd[:-1]):
        key = arg[2:].replace("-", "_") if arg.startswith("--") else None
        if key in settings:
            settings[key] = int(cmd[i + 1])
    settings["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    return settings


class DecodeMeter:
    """The decode rate of a running decode, from the times its batches' hypotheses come out.

    Start-up (loading, moving the model) ends at the last log line before the first hypothesis (the decode in
    this process marks it once the model and the split are loaded); the rate counts sentences, and source
    tokens where the subset's sizes are known (fairseq decodes short sentences first, so a token rate projects
    the rest better).
    """

    def __init__(self, total: Optional[int], source_sizes: Optional[Sequence[int]] = None,
                 chunk: int = 100, t0: Optional[float] = None):
        self.total, self.sizes, self.chunk = total, source_sizes, max(1, chunk)
        self.t0 = time.time() if t0 is None else t0
        self.decode_start: Optional[float] = None
        self.done, self.tokens = 0, 0
        self.total_tokens = sum(source_sizes) if source_sizes is not None else None
        self.last_log_line = self.t0
        self.first_report: Optional[dict] = None

    def use_sizes(self, source_sizes: Sequence[int]) -> None:
        """Count source tokens with ``source_sizes`` (by sentence id), known once the split is loaded."""
        self.sizes, self.total_tokens = list(source_sizes), sum(source_sizes)

    def log_line(self, now: float) -> None:
        if self.decode_start is None:
            self.last_log_line = now

    def hypothesis(self, sample_id: int, now: float) -> None:
        if self.decode_start is None:
            self.decode_start = self.last_log_line
        self.done += 1
        if self.sizes is not None and 0 <= sample_id < len(self.sizes):
            self.tokens += int(self.sizes[sample_id])

    @property
    def measured(self) -> bool:
        return self.done >= min(self.chunk, self.total or self.chunk)

    def report(self, now: float) -> dict:
        """Rate so far and the projected total wall time (seconds since the decode started)."""
        start = self.decode_start if self.decode_start is not None else now
        decode_s = max(now - start, 1e-6)
        out = {"sentences_done": self.done, "sentences_total": self.total,
               "startup_s": round(start - self.t0, 2), "decode_s": round(decode_s, 2),
               "sentences_per_s": round(self.done / decode_s, 2), "source_tokens_per_s": None,
               "projected_total_s": None}
        if self.done and self.total_tokens and self.tokens:
            rate = self.tokens / decode_s
            out["source_tokens_per_s"] = round(rate, 1)
            left = (self.total_tokens - self.tokens) / rate
        elif self.done and self.total is not None:
            left = (self.total - self.done) * decode_s / self.done
        else:
            left = None
        if left is not None:
            out["projected_total_s"] = round(now - self.t0 + max(left, 0.0), 1)
        return out


def format_rate(report: dict) -> str:
    tok, projected = report.get("source_tokens_per_s"), report.get("projected_total_s")
    return (f"decode rate {report['sentences_per_s']:.1f} sentences/s"
            + (f" ({tok:.0f} source tokens/s)" if tok else "")
            + f" over {report['sentences_done']}/{report['sentences_total'] or '?'} sentences; start-up "
            f"{report['startup_s']:.1f} s; "
            + (f"projected total {projected:.0f} s" if projected is not None else "no projection yet"))


class TimeLimitReached(EvaluationError):
    """The decode was stopped: its measured rate projected beyond --time-limit (or it ran into it)."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def write_json_atomic(path: Path, data: dict) -> None:
    """A JSON file of this command (strict JSON, marked as its own), written atomically."""
    write_json(path, data, command=COMMAND)


#: Signal that stops a decode in this process at --time-limit (between two of its Python calls).
_STOP_SIGNAL = getattr(signal, "SIGALRM", None)


class _TimeIsUp(BaseException):
    """Raised inside the decode when --time-limit is reached (no ``Exception``: fairseq's handlers let it through)."""


@contextmanager
def stop_at(limit: Optional[float]):
    """Raise :class:`_TimeIsUp` in this thread ``limit`` seconds from now (no-op without a limit, off the main
    thread or without ``SIGALRM``, where the limit is checked after each batch only); the previous timer and
    handler come back afterwards."""
    if limit is None or _STOP_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def time_is_up(signum, frame):
        raise _TimeIsUp()

    previous = signal.signal(_STOP_SIGNAL, time_is_up)
    signal.setitimer(signal.ITIMER_REAL, max(limit, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(_STOP_SIGNAL, previous)


def generation_failure(exc: BaseException) -> EvaluationError:
    """The one line for a decode that failed, as for a fairseq-generate command that ended so: its exit status and
    its last line (after the traceback, shown once on stderr, of an error)."""
    from .inprocess_generate import ArgumentsRefused

    if isinstance(exc, ArgumentsRefused):  # fairseq's parser printed its usage above
        return EvaluationError(f"fairseq-generate failed (exit {exc.code}): {exc}")
    if isinstance(exc, SystemExit):  # the plugin's one-line stops (a data-bin the model was not trained on)
        if isinstance(exc.code, int) or exc.code is None:
            return EvaluationError(f"fairseq-generate failed (exit {exc.code or 0}): it exited")
        return EvaluationError(f"fairseq-generate failed (exit 1): {exc.code}")
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return EvaluationError(f"fairseq-generate failed (exit 1): {last}")


def run_generate(
    cmd: Sequence[str], save_output: Optional[Path], *, meter: Optional[DecodeMeter] = None,
    time_limit: Optional[float] = None, progress_json: Optional[Path] = None, report_every_s: float = 5.0,
) -> Tuple[GenerateOutput, float]:
    """Decode as the fairseq-generate command ``cmd`` would, in this process
    (:class:`~.inprocess_generate.SplitDecoder` on ``cmd``'s arguments); returns (the sentences, wall seconds).

    ``meter`` times each batch as it comes out; the rate is reported once ``meter`` has measured a chunk, at most
    every ``report_every_s`` seconds. With ``time_limit``, the decode is stopped (:class:`TimeLimitReached`) once
    the measured rate projects a total beyond it, or when it is reached.
    """
    # one short line: the whole command, with the user's paths, is the result's generate_command
    what = f"python -m {cmd[2]}" if len(cmd) > 2 and cmd[1] == "-m" else cmd[0]
    print(f"evaluate_bleu: running fairseq-generate ({what}; in this process; the whole command is generate_command "
          "in the result)", file=sys.stderr, flush=True)
    t0 = time.time()
    meter = meter or DecodeMeter(None, t0=t0)
    meter.t0 = meter.last_log_line = t0
    # fairseq and the plugin are imported before the time limit is armed: an import cut short would leave them
    # half registered in this process
    from .. import fairseq_plugin  # noqa: F401  (what fairseq-generate --user-dir loads; patches fairseq's loading)
    from .inprocess_generate import SplitDecoder, import_fairseq

    import_fairseq()
    out, lines = GenerateOutput(), [] if save_output is not None else None
    decoder, stop, done = None, None, False
    try:
        # Loading runs without the timer: an exception raised at any point inside omegaconf or torch's loading
        # can leave their state broken, and the error that follows would hide the time limit.
        decoder = SplitDecoder(cmd[3:])
        if decoder.source_sizes is not None:
            meter.use_sizes(decoder.source_sizes)
        meter.log_line(time.time())  # start-up ends: the model and the split are loaded
        left = None if time_limit is None else time_limit - (time.time() - t0)
        if left is not None and left <= 0:
            stop = f"--time-limit {time_limit:g} s reached"
        else:
            with stop_at(left):
                stop = decode(decoder, meter, out, lines, time_limit=time_limit, progress_json=progress_json,
                              report_every_s=report_every_s)
        done = stop is None
    except _TimeIsUp:
        if meter.total is None or meter.done < meter.total:  # else the timer went off as the decode ended
            stop = f"--time-limit {time_limit:g} s reached"
        done = stop is None
    except (Exception, SystemExit) as exc:  # fairseq's failures (and its parser's exit) are the decode's
        raise generation_failure(exc) from None
    finally:
        wall = time.time() - t0
        final = meter.report(time.time())
        if progress_json is not None:
            write_json_atomic(progress_json, final)
        if done:
            out.finish(decoder)
        if save_output is not None:
            save_output.parent.mkdir(parents=True, exist_ok=True)
            summary = decoder.summary_lines() if done else []
            save_output.write_text("\n".join([header_line(COMMAND), *lines, *summary]) + "\n", encoding="utf-8")
    if stop is not None:
        raise TimeLimitReached(f"fairseq-generate stopped after {meter.done} of {meter.total or '?'} sentences: "
                               f"{stop} ({format_rate(final)})", final)
    return out, wall


def decode(decoder, meter: DecodeMeter, out: GenerateOutput, lines: Optional[List[str]], *,
           time_limit: Optional[float], progress_json: Optional[Path], report_every_s: float) -> Optional[str]:
    """Decode ``decoder``'s batches into ``out`` (and their output lines into ``lines``), timing them by ``meter``;
    returns why the decode stopped early (``time_limit``), or None once it is complete."""
    next_report, reported = None, 0
    for batch in decoder.batches():
        now = time.time()
        for sentence in batch:
            out.add(sentence)
            meter.hypothesis(sentence.id, now)
            if lines is not None:
                lines += sentence.output_lines()
        if meter.measured and meter.done != reported and (next_report is None or now >= next_report):
            reported, report = meter.done, meter.report(now)
            if meter.first_report is None:
                meter.first_report = report
            next_report = now + report_every_s
            print("evaluate_bleu: " + format_rate(report), file=sys.stderr, flush=True)
            if progress_json is not None:
                write_json_atomic(progress_json, report)
            projected = report["projected_total_s"]
            if time_limit is not None and projected is not None and projected > time_limit:
                return f"the measured rate projects {projected:.0f} s, beyond --time-limit {time_limit:g} s"
        if time_limit is not None and now - meter.t0 >= time_limit and meter.done != meter.total:
            return f"--time-limit {time_limit:g} s reached"
    return None


def configure_logging() -> None:
    """fairseq's log lines on stderr in fairseq-generate's format, unless this process configured logging (called
    before fairseq is first imported, whose import configures it otherwise)."""
    from .host_generate import configure_logging as fairseq_generate_logging

    fairseq_generate_logging()


def subset_size(data: Path, subset: str) -> Optional[int]:
    """Number of sentences in a binarized subset, from its index files (fairseq's ``MMapIndexedDataset``).

    Returns None when it cannot be determined (no data dir, other dataset format, several
    language pairs with different sizes).
    """
    from fairseq.data.indexed_dataset import MMapIndexedDataset, infer_dataset_impl

    sizes = set()
    for idx in sorted(Path(data).glob(f"{subset}.*-*.*.idx")):
        prefix = str(idx)[: -len(".idx")]
        try:
            if infer_dataset_impl(prefix) == "mmap":
                sizes.add(len(MMapIndexedDataset.Index(str(idx))))
        except (OSError, AssertionError, ValueError, KeyError):  # another version of the format, or cut short
            continue
    return sizes.pop() if len(sizes) == 1 else None


def result_subset(args, parsed: GenerateOutput) -> str:
    if args.from_output is not None and parsed.subset:
        return parsed.subset
    return args.gen_subset


def default_json_path(checkpoint: Path, subset: str) -> Path:
    return checkpoint.parent / f"bleu.{checkpoint.stem}.{subset}.json"


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------




def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Translate a binarized split as fairseq-generate does (in this process) and score it with "
                    "sacreBLEU. Arguments after `--` are passed to fairseq-generate's options.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("data", type=Path, help="fairseq data-bin directory (e.g. OUT/bin of prepare_corpus.py)")
    p.add_argument("--path", type=Path, default=None,
                   help="model checkpoint (.pt); required unless --from-output is given")
    p.add_argument("--gen-subset", default="test", help="binarized split to translate")
    p.add_argument("--beam", type=positive_int, default=5, help="beam size")
    p.add_argument("--batch-size", type=positive_int, default=None, help="sentences per batch")
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help=f"tokens per batch (when neither this nor --batch-size is given: {CPU_MAX_TOKENS} on the CPU, "
                        f"{GPU_MAX_TOKENS} tokens and up to {GPU_BATCH_SIZE} sentences on a CUDA GPU)")
    p.add_argument("--user-dir", default=None,
                   help="fairseq --user-dir, as given to fairseq-train (fairseq_gradinit, from any "
                        "folder, or 'gradinit' mean this repository's package; needed for checkpoints "
                        "of the translation_gradinit task)")
    p.add_argument("--cpu", action="store_true", help="generate on CPU")
    p.add_argument("--fp16", action="store_true",
                   help="decode in fp16 on a CUDA GPU (for a model trained in fp16); ignored with a note on the CPU")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop the decode once its measured decode rate projects a longer run, or at "
                        "SECONDS (no score then; the result file records the rate)")
    p.add_argument("--rate-chunk", type=int, default=100,
                   help="sentences decoded before the rate is first logged and projected")
    p.add_argument("--progress-json", type=Path, default=None,
                   help="keep the measured decode rate and projection in this file while decoding")
    p.add_argument("--ref", type=Path, default=None,
                   help="plain-text reference file (line i = sample id i) to score against "
                        "instead of the T- lines")
    p.add_argument("--tokenize", default=None,
                   help="sacreBLEU tokenizer (default: sacreBLEU's default, 13a)")
    p.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU")
    p.add_argument("--output-json", type=Path, default=None,
                   help="where to write the result (default: next to the checkpoint, "
                        "bleu.<checkpoint>.<subset>.json)")
    p.add_argument("--save-output", type=Path, default=None,
                   help="also save the decode's output, the lines fairseq-generate prints, to this file")
    # generate_command's module; benchmarks/subprocess_bleu.py (the former subprocess decode) runs it as the command
    p.add_argument("--generate-module", default=None, help=argparse.SUPPRESS)
    p.add_argument("--from-output", type=Path, default=None,
                   help="do not decode; score this saved generate output instead")
    return p


def split_passthrough(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    configure_logging()
    try:
        check_paths(args)
        return evaluate(args, extra)
    except ArgumentProblem as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def decode_block(meter: DecodeMeter, time_limit: Optional[float]) -> dict:
    """The result's ``decode`` entry: the rate over the whole run, after the first chunk, the limit."""
    return {**meter.report(time.time()), "first_chunk": meter.first_report, "time_limit_s": time_limit}


def write_stopped(args, cmd, stopped: "TimeLimitReached", fp16: bool, note: Optional[str], meter: DecodeMeter) -> None:
    """The result file of a run stopped by --time-limit: no score, the reason and the measured rate."""
    out_json = args.output_json or default_json_path(args.path, args.gen_subset)
    write_json_atomic(out_json, {
        "bleu": None, "reason": str(stopped), "checkpoint": str(args.path), "data": str(args.data),
        "subset": args.gen_subset, "beam": args.beam, "generate_command": cmd,
        "precision": "fp16" if fp16 else "fp32", "precision_note": note, "batches": batch_settings(cmd),
        "decode": {**stopped.report, "first_chunk": meter.first_report, "time_limit_s": args.time_limit},
    })


def evaluate(args, extra: Sequence[str]) -> int:
    """Generate (or read the saved output), score, write the JSON; 0, or 1 after an error line."""
    meter, device_note, fp16 = None, None, False
    try:
        if args.from_output is None and args.path is None:
            raise EvaluationError("--path CHECKPOINT is required (unless --from-output is given)")
        if args.from_output is not None:
            cmd, wall = None, None
            parsed = parse_generate_output(text_lines(args.from_output))
        else:
            check_inputs(args)
            cuda, fp16, device_note = decode_device(args)
            if device_note:
                print(f"note: {device_note}", file=sys.stderr)
            cmd = build_generate_command(args, extra, cuda=cuda, fp16=fp16)
            if args.ref is not None:
                problem = binarized_reference_problem(args.ref, args.data, args.gen_subset, cmd)
                if problem:
                    raise ArgumentProblem(f"argument --ref: {problem}")
            meter = DecodeMeter(subset_size(args.data, args.gen_subset), chunk=args.rate_chunk)
            try:
                parsed, wall = run_generate(cmd, args.save_output, meter=meter, time_limit=args.time_limit,
                                            progress_json=args.progress_json)
            except TimeLimitReached as stopped:
                write_stopped(args, cmd, stopped, fp16, device_note, meter)
                raise
        expected = subset_size(args.data, result_subset(args, parsed))
        ref_lines = read_reference_file(args.ref) if args.ref is not None else None
        if ref_lines is not None:
            mismatch = reference_mismatch(parsed, ref_lines)
            if mismatch:
                raise EvaluationError(f"--ref {args.ref}: {mismatch}")
        ids, hyps, refs = pair_up(parsed, ref_lines)
        if ref_lines is None and any("<<unk>>" in r for r in refs):
            print("warning: some T- references contain <<unk>>; pass --ref with the raw "
                  "reference file for exact scoring", file=sys.stderr)
        if expected is not None and len(ids) != expected:
            print(f"warning: fairseq-generate output has {len(ids)} hypotheses but the "
                  f"binarized subset has {expected} sentences; BLEU covers only the translated "
                  "ones", file=sys.stderr)
        elif ref_lines is not None and len(ids) != len(ref_lines):
            print(f"warning: {len(ids)} hypotheses for {len(ref_lines)} reference lines; "
                  "scoring only the translated ids", file=sys.stderr)
        scores = score_bleu(hyps, refs, tokenize=args.tokenize, lowercase=args.lowercase)
    except (EvaluationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    result = {
        **scores,
        "n_sentences": len(ids),
        # A model that ignores its source writes one sentence for every source: BLEU alone can hide it.
        "distinct_hypotheses": len(set(hyps)),
        "n_subset_sentences": expected,
        "checkpoint": str(args.path) if args.path is not None else None,
        "data": str(args.data),
        "subset": result_subset(args, parsed),
        "beam": (parsed.beam if args.from_output is not None and parsed.beam else args.beam),
        "references": str(args.ref) if args.ref is not None else "T- lines",
        "generation_wall_time_s": round(wall, 2) if wall is not None else None,
        "fairseq_translate_time_s": parsed.translate_seconds,
        "fairseq_bleu": parsed.fairseq_bleu,
        "generate_command": cmd,
        "generate_output": str(args.from_output or args.save_output or "") or None,
        "precision": None if cmd is None else ("fp16" if fp16 else "fp32"),
        "precision_note": device_note,
        "batches": None if cmd is None else batch_settings(cmd),
        "decode": None if meter is None else decode_block(meter, args.time_limit),
    }
    out_json = args.output_json or default_json_path(
        args.path if args.path is not None else args.from_output, result["subset"])
    write_json(out_json, result, command=COMMAND, indent=2, ensure_ascii=False)
    print(format_summary(result))
    return 0


run = quiet_command(main, COMMAND)


if __name__ == "__main__":
    sys.exit(run())
