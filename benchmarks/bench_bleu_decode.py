#!/usr/bin/env python3
"""Time the BLEU step's translation: one decode alone and several at once, with given batch settings, in
this process's decode or the former subprocess one.

Each case runs ``python -m fairseq_gradinit.tools.evaluate_bleu`` (what the study's BLEU step runs; it decodes
in its own process) once per decode at the same time, or, for a ``subprocess``/``stock`` case, the former
BLEU step (``benchmarks/subprocess_bleu.py``: fairseq-generate as a subprocess, its output read), and records
per decode its wall and processor time (start-up included), its measured decode rate and batch settings, and
the case's wall time. Cases run one after the other::

    python benchmarks/bench_bleu_decode.py DATA-BIN --path CKPT --user-dir gradinit --fp16 \\
        --case alone:1 --case alone-4x1k:1:16384:1024 --case five:5 --out bleu_decode.json -- \\
        --max-len-a 1.2 --max-len-b 10

A case is ``NAME:AT_ONCE[:MAX_TOKENS:BATCH_SIZE[:subprocess|:stock]]`` (no batch settings: evaluate_bleu's
defaults for the device; ``subprocess``: the former path, fairseq-generate as
:mod:`fairseq_gradinit.tools.host_generate`; ``stock``: the former path with fairseq's own
``fairseq_cli.generate``, which reads source tokens from the device one by one). A ``NAME:AT_ONCE:subprocess``
case takes the default batches too. Arguments after ``--`` go to fairseq-generate. Each decode gets
``OMP_NUM_THREADS`` = cores // AT_ONCE unless the environment sets it (as the study's BLEU step does). With
``--out X.json`` a table of the cases is written to ``X.md`` as well.

The in-process and subprocess paths on the same checkpoint, one after the other, one thread::

    OMP_NUM_THREADS=1 python benchmarks/bench_bleu_decode.py DATA-BIN --path CKPT --cpu --beam 5 \\
        --case subprocess:1:subprocess --case in-process:1 --out benchmarks/results/bleu_decode_cpu.json -- \\
        --max-len-a 1.2 --max-len-b 10
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

#: The former BLEU step, fairseq-generate as a subprocess (the baseline of the in-process decode).
SUBPROCESS_BLEU = Path(__file__).resolve().parent / "subprocess_bleu.py"
PATHS = ("subprocess", "stock")


def parse_case(text: str) -> dict:
    parts = text.split(":")
    path = parts.pop() if len(parts) in (3, 5) and parts[-1] in PATHS else None
    if len(parts) not in (2, 4) or not all(p.isdigit() for p in parts[1:]) or int(parts[1]) < 1:
        raise argparse.ArgumentTypeError(f"--case {text!r}: give NAME:AT_ONCE or NAME:AT_ONCE:MAX_TOKENS:BATCH_SIZE"
                                         "[:subprocess|:stock]")
    case = {"name": parts[0], "at_once": int(parts[1]), "max_tokens": None, "batch_size": None,
            "path": "in-process" if path is None else "subprocess",
            "generate_module": "fairseq_cli.generate" if path == "stock" else None}
    if len(parts) == 4:
        case.update(max_tokens=int(parts[2]), batch_size=int(parts[3]))
    return case


def decode_command(args, case: dict, out_json: Path, extra: Sequence[str]) -> List[str]:
    command = ["-m", "fairseq_gradinit.tools.evaluate_bleu"] if case["path"] == "in-process" else [str(SUBPROCESS_BLEU)]
    cmd = [sys.executable, *command, str(args.data), "--path", str(args.path),
           "--beam", str(args.beam), "--gen-subset", args.gen_subset, "--output-json", str(out_json)]
    for flag, value in (("--user-dir", args.user_dir), ("--ref", args.ref), ("--time-limit", args.time_limit),
                        ("--max-tokens", case["max_tokens"]), ("--batch-size", case["batch_size"]),
                        ("--generate-module", case["generate_module"])):
        if value is not None:
            cmd += [flag, str(value)]
    cmd += ["--cpu"] if args.cpu else []
    cmd += ["--fp16"] if args.fp16 else []
    return cmd + ["--", *extra]


def run_case(args, case: dict, work: Path, extra: Sequence[str]) -> dict:
    """Start the case's decodes together, wait for all; per decode its wall time and its result's numbers."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // case["at_once"])))
    procs = []
    t0 = time.time()
    for i in range(case["at_once"]):
        out_json = work / f"{case['name']}.{i}.json"
        log = open(work / f"{case['name']}.{i}.log", "w", encoding="utf-8")
        procs.append((subprocess.Popen(decode_command(args, case, out_json, extra), stdout=log,
                                       stderr=subprocess.STDOUT, env=env), out_json, log))
    decodes = []
    for proc, out_json, log in procs:
        # the processor time of the decode and of fairseq-generate under it: on a shared host, the figure
        # that the other processes' load does not stretch
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        log.close()
        result = json.loads(out_json.read_text()) if out_json.is_file() else {}
        decodes.append({"returncode": rc, "wall_s": round(time.time() - t0, 2),
                        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "bleu": result.get("bleu"),
                        "signature": result.get("signature"), "fairseq_bleu": result.get("fairseq_bleu"),
                        "n_sentences": result.get("n_sentences"), "batches": result.get("batches"),
                        "decode": result.get("decode"), "log": str(log.name)})
    wall = time.time() - t0
    sentences = sum(d["n_sentences"] or 0 for d in decodes)
    return {**case, "omp_num_threads": env["OMP_NUM_THREADS"], "wall_s": round(wall, 2),
            "sentences_per_s": round(sentences / wall, 2), "decodes": decodes}


def torch_version() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def commit() -> Optional[str]:
    """The repository's commit (with ``+dirty`` for uncommitted changes), or None outside a git checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def markdown(report: dict) -> str:
    """scripts/benchmark_tables.py's table of this benchmark (the one benchmarks/README.md shows)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_tables", Path(__file__).resolve().parents[1] / "scripts"
                                                  / "benchmark_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    return tables.bleu_decode_markdown(report)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", type=Path, help="fairseq data-bin")
    p.add_argument("--path", type=Path, required=True, help="checkpoint to translate with")
    p.add_argument("--user-dir", default=None, help="as for evaluate_bleu (gradinit: this package)")
    p.add_argument("--gen-subset", default="test")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--ref", type=Path, default=None, help="raw reference file (else the T- lines)")
    p.add_argument("--time-limit", type=float, default=None, help="each decode's --time-limit (seconds)")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--case", dest="cases", type=parse_case, action="append", required=True,
                   help="NAME:AT_ONCE[:MAX_TOKENS:BATCH_SIZE][:subprocess|:stock], repeatable; run in the order given")
    p.add_argument("--out", type=Path, required=True, help="result JSON (the decodes' logs go beside it)")
    p.add_argument("--note", default=None, help="what the result should say about the machine (its load, ...)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    work = args.out.with_suffix("")
    work.mkdir(parents=True, exist_ok=True)
    cases = []
    for case in args.cases:
        cases.append(run_case(args, case, work, extra))
        c = cases[-1]
        print(f"{c['name']}: {c['at_once']} at once, {c['wall_s']:.1f} s, {c['sentences_per_s']:.1f} sentences/s "
              f"in all; return codes {[d['returncode'] for d in c['decodes']]}", flush=True)
        report = {"device": "cpu" if args.cpu else "cuda", "cpu_count": os.cpu_count(), "torch": torch_version(),
                  "commit": commit(), "note": args.note, "data": str(args.data), "checkpoint": str(args.path),
                  "beam": args.beam, "generate_args": extra, "cases": cases}
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        if args.out.suffix == ".json":
            args.out.with_suffix(".md").write_text(markdown(report) + "\n")
    return 0 if all(d["returncode"] == 0 for c in cases for d in c["decodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
