"""Decoding for gradinit-evaluate-bleu: fairseq-generate's decode of a binarized split, in this process, timed.

:class:`DecodeConfig` says what to decode and how (the split, the checkpoint, the beam, the batches, the device and
the further fairseq-generate options); :class:`~.inprocess_generate.SplitDecoder` is built from it, and its
:meth:`~DecodeConfig.command` is the fairseq-generate command that prints the same hypotheses (the result's
``generate_command``). :func:`run_generate` decodes the split batch by batch, measures the decode rate as it goes
(:class:`DecodeMeter`) and stops at ``--time-limit``.

On a CUDA GPU the batches are larger (``--max-tokens 65536``, up to 4096 sentences) and fp16 decodes in half
precision where it was asked for; on the CPU fp16 is ignored with a note (fairseq's CPU decoding is fp32).
``--required-batch-size-multiple 1`` is added unless the further options give it: with fairseq's default of 8 the
last batch is dropped when its size is not a multiple of 8, so a few sentences would silently go untranslated.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..files.paths import header_line, write_json
from .bleu_score import EvaluationError, GenerateOutput

#: The command this package installs for the BLEU step (the files it writes are marked as its own).
COMMAND = "gradinit-evaluate-bleu"
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


@dataclass(frozen=True)
class DecodeConfig:
    """What to decode and how. ``fairseq_options`` are further fairseq-generate options (gradinit-evaluate-bleu's
    arguments after ``--``); fairseq's own parser reads them with the rest (:meth:`fairseq_args`), as it defines
    what they mean, and where they repeat a field, theirs wins (an option's last value does)."""

    data: Path
    path: Path
    gen_subset: str = "test"
    beam: int = 5
    max_tokens: Optional[int] = CPU_MAX_TOKENS
    batch_size: Optional[int] = None
    user_dir: Optional[Path] = None
    cpu: bool = False
    fp16: bool = False
    #: fairseq-generate's ``--remove-bpe``: how the target dictionary's pieces are joined back into words (None: the
    #: tokens are words, printed as they are; :func:`~.bleu_checks.data_segmentation` picks it from the dictionary)
    post_process: Optional[str] = "sentencepiece"
    num_workers: int = GENERATE_NUM_WORKERS
    #: fairseq 0.12 drops the last batch when its size is not a multiple of this value (default 8), silently
    #: leaving up to 7 sentences untranslated (fairseq issue #5036)
    required_batch_size_multiple: int = 1
    fairseq_options: Tuple[str, ...] = ()

    @classmethod
    def for_device(cls, cuda: bool, max_tokens: Optional[int] = None, batch_size: Optional[int] = None,
                   **fields) -> "DecodeConfig":
        """The configuration with the device's batches where neither ``max_tokens`` nor ``batch_size`` is given."""
        if max_tokens is None and batch_size is None:
            max_tokens, batch_size = (GPU_MAX_TOKENS, GPU_BATCH_SIZE) if cuda else (CPU_MAX_TOKENS, None)
        fields["fairseq_options"] = tuple(fields.get("fairseq_options", ()))
        return cls(max_tokens=max_tokens, batch_size=batch_size, **fields)

    def fairseq_args(self) -> List[str]:
        """fairseq-generate's arguments for this decode: the fields, then the further options."""
        given = set(self.fairseq_options)
        args = [str(self.data), "--path", str(self.path), "--gen-subset", self.gen_subset, "--beam", str(self.beam)]
        if self.post_process is not None:
            args += ["--remove-bpe", self.post_process]
        if self.batch_size is not None:
            args += ["--batch-size", str(self.batch_size)]
        if self.max_tokens is not None:
            args += ["--max-tokens", str(self.max_tokens)]
        if self.user_dir is not None:
            args += ["--user-dir", str(self.user_dir)]
        if self.cpu:
            args.append("--cpu")
        if self.fp16 and "--fp16" not in given:
            args.append("--fp16")
        if "--num-workers" not in given:
            args += ["--num-workers", str(self.num_workers)]
        if "--required-batch-size-multiple" not in given:
            args += ["--required-batch-size-multiple", str(self.required_batch_size_multiple)]
        return args + list(self.fairseq_options)

    def command(self, module: str = GENERATE_MODULE) -> List[str]:
        """The fairseq-generate command line that prints this decode's hypotheses."""
        return [sys.executable, "-m", module, *self.fairseq_args()]

    def batches(self) -> dict:
        """The batch settings the decode runs with (:func:`batch_settings`)."""
        return batch_settings(self.fairseq_args())


def batch_settings(argv: Sequence[str]) -> dict:
    """The batching options of fairseq-generate arguments (the last value of each, as argparse takes it; None where
    fairseq's default applies) and the intra-op threads the decode runs with."""
    settings = {"max_tokens": None, "batch_size": None, "num_workers": None, "required_batch_size_multiple": None}
    for i, arg in enumerate(argv[:-1]):
        key = arg[2:].replace("-", "_") if arg.startswith("--") else None
        if key in settings:
            settings[key] = int(argv[i + 1])
    settings["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
    return settings


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def decode_device(cpu: bool, fp16: bool, cuda: Optional[bool] = None) -> Tuple[bool, bool, Optional[str]]:
    """(on CUDA, in fp16, note): fp16 only where it was asked for and a CUDA GPU decodes (``cuda``: whether one
    does, detected when None)."""
    cuda = not cpu and (cuda_available() if cuda is None else cuda)
    if fp16 and not cuda:
        return False, False, "--fp16 ignored: no CUDA GPU decodes here, fairseq-generate runs in fp32"
    return cuda, bool(fp16 and cuda), None


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
    config: DecodeConfig, save_output: Optional[Path], *, meter: Optional[DecodeMeter] = None,
    time_limit: Optional[float] = None, progress_json: Optional[Path] = None, report_every_s: float = 5.0,
) -> Tuple[GenerateOutput, float]:
    """Decode as ``config``'s fairseq-generate command would, in this process
    (:class:`~.inprocess_generate.SplitDecoder` built from ``config``); returns (the sentences, wall seconds).

    ``meter`` times each batch as it comes out; the rate is reported once ``meter`` has measured a chunk, at most
    every ``report_every_s`` seconds. With ``time_limit``, the decode is stopped (:class:`TimeLimitReached`) once
    the measured rate projects a total beyond it, or when it is reached.
    """
    # one short line: the whole command, with the user's paths, is the result's generate_command
    print(f"evaluate_bleu: running fairseq-generate (python -m {GENERATE_MODULE}; in this process; the whole command "
          "is generate_command in the result)", file=sys.stderr, flush=True)
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
        decoder = SplitDecoder(config)
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


