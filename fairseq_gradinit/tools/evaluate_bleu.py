#!/usr/bin/env python3
"""Translate a binarized split with fairseq-generate and score it with sacreBLEU.

Runs::

    python -m fairseq_gradinit.tools.host_generate DATA --path CKPT --gen-subset SUBSET --beam 5 \\
        --remove-bpe sentencepiece --max-tokens N [--batch-size B] [--user-dir D] [--cpu] \\
        --num-workers 0 [EXTRA...]

(fairseq-generate, with token strings built from host lists: :mod:`.host_generate`) with the same
Python interpreter, collects the ``H-<id>`` (hypothesis) and ``T-<id>`` (reference)
lines, which ``--remove-bpe sentencepiece`` has already turned back into plain text, and computes
corpus BLEU with ``sacrebleu.metrics.BLEU`` (13a tokenization by default). A JSON file with the
score, its signature and the run details is written, and a one-line summary is printed.

Everything after ``--`` is passed unchanged to fairseq-generate, e.g.::

    python scripts/evaluate_bleu.py data-bin/debian-ui-de-en/bin \\
        --path checkpoints/run1/checkpoint_best.pt --cpu -- --lenpen 1.0 --nbest 1

``--ref FILE`` scores against a raw reference file (line i = sample id i) instead of the ``T-``
lines, which come from the binarized data (SentencePiece-normalized, unknown words as
``<<unk>>``). The file is compared with the ``T-`` lines (letters and digits, lowercased) and
refused when more than half of them differ (the target file of another split). ``--from-output FILE`` scores a saved fairseq-generate output without running it.

On a CUDA GPU the batches are larger (``--max-tokens 65536``, up to 4096 sentences) and ``--fp16`` decodes in half precision (fairseq-generate
``--fp16``; asked for when the model trained in fp16). On the CPU ``--fp16`` is ignored with a note
(fairseq's CPU decoding is fp32). The decode rate is measured while fairseq-generate runs (sentences and
source tokens per second since its start-up ended), logged once the batches holding the first
``--rate-chunk`` sentences are out (fairseq prints a batch's hypotheses together when the batch is decoded)
and then every few seconds, written to ``--progress-json`` and kept in the result's ``decode`` block;
with ``--time-limit S`` the run stops as soon as that rate projects a total beyond S seconds (or at S),
and the result file says so, with the rate.

``--required-batch-size-multiple 1`` is added unless given after ``--``: with fairseq's default
of 8 the last batch is dropped when its size is not a multiple of 8, so a few test sentences
would silently go untranslated. The number of hypotheses is also checked against the size of
the binarized subset.

fairseq 0.12.3 cannot load its checkpoints under torch >= 2.6 (``torch.load`` now defaults to
``weights_only=True``); the subprocess therefore runs with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``
(only evaluate checkpoints you trust).
"""

from __future__ import annotations

import argparse
import html
import os
import queue
import re
import struct
import subprocess
import sys
import threading
import time
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple
from ..argtypes import positive_int
from ..checkpoints import load_trusted_checkpoint, trusted_loading_env
from ..paths import OutputError, check_output, header_line, json_result, text_lines, text_output, utf8_problem, write_json
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


def parse_generate_output(lines: Iterable[str]) -> GenerateOutput:
    """Parse fairseq-generate stdout.

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


def format_summary(result: dict) -> str:
    wall = result.get("generation_wall_time_s")
    wall_s = f"{wall:.1f}s" if isinstance(wall, (int, float)) else "n/a"
    return (
        f"BLEU {result['bleu']:.2f} | {result['subset']} | beam {result['beam']} | "
        f"{result['n_sentences']} sents | gen {wall_s} | {result['checkpoint']} | "
        f"{result['signature']}"
    )


# --------------------------------------------------------------------------------------------
# running fairseq-generate
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


def check_paths(args) -> None:
    """Before any work: the files read are readable text, ``--ref`` has one line per sentence of the split
    (when the split is translated here), and no file written is an input or a file of another kind
    (``ArgumentProblem``)."""
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
#: fairseq-generate reads the batches in this process (its default, 1 worker, forks one more process
#: per decode, which outlives a stop by seconds while holding the output open).
GENERATE_NUM_WORKERS = 0
#: The module run as fairseq-generate (fairseq_cli.generate with token strings built on the host).
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
    """The fairseq-generate command line; ``cuda`` (detected when None) picks the batch defaults."""
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


def generate_env() -> Dict[str, str]:
    """Environment for fairseq-generate.

    fairseq 0.12.3 calls ``torch.load`` without ``weights_only``; torch >= 2.6 then refuses its
    checkpoints (they pickle an argparse.Namespace). The checkpoints evaluated here are our own,
    so the subprocess gets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` unless the caller set either
    torch variable already.
    """
    env = trusted_loading_env(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # hypotheses arrive per batch, so the decode rate is measured as it goes
    return env


class DecodeMeter:
    """The decode rate of a running fairseq-generate, from the times its hypotheses arrive.

    Start-up (loading, moving the model) ends at the last log line before the first hypothesis;
    the rate counts sentences, and source tokens where the subset's sizes are known (fairseq
    decodes short sentences first, so a token rate projects the rest better).
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
        """Rate so far and the projected total wall time (seconds since fairseq-generate started)."""
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
    """fairseq-generate was stopped: its measured rate projected beyond --time-limit (or it ran into it)."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def write_json_atomic(path: Path, data: dict) -> None:
    """A JSON file of this command (strict JSON, marked as its own), written atomically."""
    write_json(path, data, command=COMMAND)


#: Seconds without a new output line after which a batch's hypotheses are taken to be all out.
BATCH_QUIET_S = 0.5


def lines_with_pauses(stdout: Iterable[str], quiet_s: float):
    """``stdout``'s lines, each as (line, time read), and ``(None, time)`` whenever no line came for
    ``quiet_s`` seconds: fairseq-generate prints a whole batch's hypotheses at once, then decodes the next."""
    lines: "queue.Queue" = queue.Queue()

    def pump() -> None:
        for raw in stdout:
            lines.put((raw, time.time()))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            item = lines.get(timeout=quiet_s)
        except queue.Empty:
            yield None, time.time()
            continue
        if item is None:
            return
        yield item


def read_output(stdout: Iterable[str], meter: DecodeMeter, stop_generate, *, time_limit: Optional[float],
                progress_json: Optional[Path], report_every_s: float, quiet_s: float = BATCH_QUIET_S) -> List[str]:
    """fairseq-generate's stdout lines, each hypothesis timed by ``meter``. The rate is reported, at most every
    ``report_every_s`` seconds, once a batch's hypotheses are all out (the output pauses for ``quiet_s``):
    counted in the middle of a batch, a rate would take the batch's decode time for a fraction of its
    sentences. ``stop_generate(reason)`` is called once the rate projects beyond ``time_limit``."""
    out_lines: List[str] = []
    next_report, last_hypothesis, reported = None, None, 0
    for raw, now in lines_with_pauses(stdout, quiet_s):
        if raw is not None:
            line = raw.rstrip("\n")
            out_lines.append(line)
            m = _HYP_RE.match(line)
            if m:
                meter.hypothesis(int(m.group(1)), now)
                last_hypothesis = now
            continue
        if (last_hypothesis is None or meter.done == reported or not meter.measured
                or (next_report is not None and now < next_report)):
            continue
        reported = meter.done
        report = meter.report(last_hypothesis)
        if meter.first_report is None:
            meter.first_report = report
        next_report = now + report_every_s
        print("evaluate_bleu: " + format_rate(report), file=sys.stderr, flush=True)
        if progress_json is not None:
            write_json_atomic(progress_json, report)
        projected = report["projected_total_s"]
        if time_limit is not None and projected is not None and projected > time_limit:
            stop_generate(f"the measured rate projects {projected:.0f} s, beyond --time-limit {time_limit:g} s")
    return out_lines


def run_generate(
    cmd: Sequence[str], save_output: Optional[Path], *, meter: Optional[DecodeMeter] = None,
    time_limit: Optional[float] = None, progress_json: Optional[Path] = None, report_every_s: float = 5.0,
) -> Tuple[List[str], List[str], float]:
    """Run fairseq-generate; returns (stdout lines, stderr lines, wall seconds).

    stdout (the S/T/H/D/P lines) is read as it comes, each hypothesis timed by ``meter``; stderr
    (where fairseq's log usually ends up) is echoed live and also returned, without the very long
    config line. With ``time_limit``, the run is stopped (:class:`TimeLimitReached`) once the
    measured rate projects a total beyond it, or when it is reached.
    """
    # one short line: the whole command, with the user's paths, is the result's generate_command
    what = f"python -m {cmd[2]}" if len(cmd) > 2 and cmd[1] == "-m" else cmd[0]
    print(f"evaluate_bleu: running fairseq-generate ({what}; the whole command is generate_command in the result)",
          file=sys.stderr, flush=True)
    t0 = time.time()
    meter = meter or DecodeMeter(None, t0=t0)
    meter.t0 = meter.last_log_line = t0
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            encoding="utf-8", errors="replace", env=generate_env())
    err_lines: List[str] = []
    stop: Dict[str, str] = {}

    def pump_stderr() -> None:
        for line in proc.stderr:
            meter.log_line(time.time())
            sys.stderr.write(line)
            if len(line) < 2000:
                err_lines.append(line.rstrip("\n"))

    def stop_generate(reason: str) -> None:
        if proc.poll() is None and not stop:
            stop["reason"] = reason
            proc.kill()

    pump = threading.Thread(target=pump_stderr, daemon=True)
    pump.start()
    timer = None
    if time_limit is not None:
        timer = threading.Timer(max(time_limit, 0.0), stop_generate, args=(f"--time-limit {time_limit:g} s reached",))
        timer.daemon = True
        timer.start()
    try:
        out_lines = read_output(proc.stdout, meter, stop_generate, time_limit=time_limit,
                                progress_json=progress_json, report_every_s=report_every_s)
    finally:
        if timer is not None:
            timer.cancel()
    returncode = proc.wait()
    pump.join(timeout=10)
    wall = time.time() - t0
    final = meter.report(time.time())
    if progress_json is not None:
        write_json_atomic(progress_json, final)
    if save_output is not None:
        save_output.parent.mkdir(parents=True, exist_ok=True)
        save_output.write_text("\n".join([header_line(COMMAND), *out_lines]) + "\n", encoding="utf-8")
    if stop:
        raise TimeLimitReached(f"fairseq-generate stopped after {meter.done} of {meter.total or '?'} sentences: "
                               f"{stop['reason']} ({format_rate(final)})", final)
    if returncode != 0:
        # stderr (fairseq's traceback) was already shown above: name only its last line here.
        last = next((line.strip() for line in reversed(err_lines) if line.strip()), "no error output")
        raise EvaluationError(f"fairseq-generate failed (exit {returncode}): {last}")
    return out_lines, err_lines, wall


def source_sizes(data: Path, subset: str) -> Optional[List[int]]:
    """Source-side token counts of a binarized subset (``SUBSET.SRC-TGT.SRC.idx``, mmap format)."""
    from array import array

    for idx in sorted(Path(data).glob(f"{subset}.*-*.*.idx")):
        pair, lang = idx.name.split(".")[1:3]
        if pair.split("-")[0] != lang:
            continue
        try:
            raw = idx.read_bytes()
        except OSError:
            return None
        if len(raw) < 34 or raw[:9] != b"MMIDIDX\x00\x00":
            return None
        n = struct.unpack("<Q", raw[18:26])[0]
        sizes = array("i")
        sizes.frombytes(raw[34:34 + 4 * n])
        if sys.byteorder != "little":
            sizes.byteswap()
        return list(sizes) if len(sizes) == n else None
    return None


def subset_size(data: Path, subset: str) -> Optional[int]:
    """Number of sentences in a binarized subset, read from the header of its mmap .idx file.

    Returns None when it cannot be determined (no data dir, other dataset format, several
    language pairs with different sizes).
    """
    sizes = set()
    for idx in sorted(Path(data).glob(f"{subset}.*-*.*.idx")):
        try:
            with open(idx, "rb") as f:
                header = f.read(26)
        except OSError:
            continue
        if len(header) == 26 and header[:9] == b"MMIDIDX\x00\x00":
            sizes.add(struct.unpack("<Q", header[18:26])[0])
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
        description="Run fairseq-generate on a binarized split and score it with sacreBLEU. "
                    "Arguments after `--` are passed to fairseq-generate.",
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
                   help="stop fairseq-generate once its measured decode rate projects a longer run, or at "
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
                   help="also save the raw fairseq-generate stdout to this file")
    # benchmarks/bench_bleu_decode.py compares fairseq's own module (fairseq_cli.generate) with GENERATE_MODULE
    p.add_argument("--generate-module", default=None, help=argparse.SUPPRESS)
    p.add_argument("--from-output", type=Path, default=None,
                   help="do not run fairseq-generate; score this saved generate output instead")
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
            cmd = None
            lines = text_lines(args.from_output)
            err_lines, wall = [], None
        else:
            check_inputs(args)
            cuda, fp16, device_note = decode_device(args)
            if device_note:
                print(f"note: {device_note}", file=sys.stderr)
            cmd = build_generate_command(args, extra, cuda=cuda, fp16=fp16)
            meter = DecodeMeter(subset_size(args.data, args.gen_subset), source_sizes(args.data, args.gen_subset),
                                chunk=args.rate_chunk)
            try:
                lines, err_lines, wall = run_generate(cmd, args.save_output, meter=meter, time_limit=args.time_limit,
                                                      progress_json=args.progress_json)
            except TimeLimitReached as stopped:
                write_stopped(args, cmd, stopped, fp16, device_note, meter)
                raise

        parsed = parse_generate_output(lines)
        if parsed.translate_seconds is None and err_lines:  # fairseq logged to stderr
            logged = parse_generate_output(line for line in err_lines if _TRANSLATED_RE.search(line))
            parsed.translate_seconds = logged.translate_seconds
            parsed.n_translated = logged.n_translated
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
