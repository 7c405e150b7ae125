#!/usr/bin/env python3
"""The BLEU step as it was before it decoded in its own process: fairseq-generate run as a subprocess, its
stdout read line by line (threads, a regular expression per line) and the split's sizes read from the
headers of its ``.idx`` files. Kept, unchanged in what it does, as the baseline that
``bench_bleu_decode.py`` times the in-process decode of :mod:`fairseq_gradinit.tools.evaluate_bleu` against,
and as the independent reference of ``tests/tools/test_bleu_inprocess.py``.

``python benchmarks/subprocess_bleu.py`` takes ``gradinit-evaluate-bleu``'s arguments (those of a decode:
``--from-output`` is not one) and writes the same result file (score, signature, decode rate, batch settings,
``generate_command``).
"""
from __future__ import annotations

import os
import queue
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from fairseq_gradinit.files.checkpoints import trusted_loading_env
from fairseq_gradinit.files.paths import header_line
from fairseq_gradinit.tools import evaluate_bleu
from fairseq_gradinit.tools.evaluate_bleu import (
    COMMAND,
    DecodeMeter,
    EvaluationError,
    TimeLimitReached,
    batch_settings,
    format_rate,
    write_json_atomic,
)

_HYP_RE = re.compile(r"^H-(\d+)\t")
_TRANSLATED_RE = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s")


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



def evaluate(args, extra: Sequence[str]) -> int:
    """gradinit-evaluate-bleu's decode as it was: fairseq-generate as a subprocess, its output parsed, sacreBLEU."""
    meter, device_note, fp16 = None, None, False
    try:
        if args.path is None:
            raise EvaluationError("--path CHECKPOINT is required")
        evaluate_bleu.check_inputs(args)
        cuda, fp16, device_note = evaluate_bleu.decode_device(args.cpu, args.fp16)
        config = evaluate_bleu.decode_config(args, extra, cuda=cuda, fp16=fp16)
        cmd = config.command(args.generate_module)
        meter = DecodeMeter(subset_size(args.data, args.gen_subset), source_sizes(args.data, args.gen_subset),
                            chunk=args.rate_chunk)
        try:
            lines, err_lines, wall = run_generate(cmd, args.save_output, meter=meter, time_limit=args.time_limit,
                                                  progress_json=args.progress_json)
        except TimeLimitReached as stopped:
            evaluate_bleu.write_stopped(args, config, stopped, device_note, meter, command=cmd)
            raise
        parsed = evaluate_bleu.parse_generate_output(lines)
        if parsed.translate_seconds is None and err_lines:  # fairseq logged to stderr
            logged = evaluate_bleu.parse_generate_output(line for line in err_lines if _TRANSLATED_RE.search(line))
            parsed.translate_seconds, parsed.n_translated = logged.translate_seconds, logged.n_translated
        ref_lines = evaluate_bleu.read_reference_file(args.ref) if args.ref is not None else None
        ids, hyps, refs = evaluate_bleu.pair_up(parsed, ref_lines)
        scores = evaluate_bleu.score(hyps, refs, args.metric, tokenize=args.tokenize, lowercase=args.lowercase)
    except (EvaluationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    result = {**scores, "n_sentences": len(ids), "checkpoint": str(args.path), "subset": args.gen_subset,
              "beam": args.beam, "generation_wall_time_s": round(wall, 2),
              "fairseq_translate_time_s": parsed.translate_seconds, "fairseq_bleu": parsed.fairseq_bleu,
              "generate_command": cmd, "precision": "fp16" if fp16 else "fp32", "batches": batch_settings(cmd),
              "decode": evaluate_bleu.decode_block(meter, args.time_limit), "path": "subprocess"}
    write_json_atomic(args.output_json or evaluate_bleu.default_json_path(args.path, args.gen_subset), result)
    print(evaluate_bleu.format_summary(result))
    return 0


def build_parser():
    """gradinit-evaluate-bleu's options, and the module of the fairseq-generate command to run."""
    parser = evaluate_bleu.build_parser()
    parser.add_argument("--generate-module", default=evaluate_bleu.GENERATE_MODULE,
                        help="the fairseq-generate module run as the command (fairseq_cli.generate: fairseq's own)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, extra = evaluate_bleu.split_passthrough(sys.argv[1:] if argv is None else argv)
    return evaluate(build_parser().parse_args(own), extra)


if __name__ == "__main__":
    sys.exit(main())
