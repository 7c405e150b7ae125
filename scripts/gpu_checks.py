#!/usr/bin/env python3
"""The GPU checks of the GradInit phase as one command: the end-to-end phase benchmark at d=512
(``benchmarks/bench_phase_e2e.py``) and the phase benchmark by precision (``benchmarks/bench_gpu_phase.py``),
packed into one archive.

On a machine with CUDA both benchmarks run at the paper's size (6+6 layers, d=512, FFN 1024, 4 heads,
4096-token batches) within ``--budget`` seconds in all (default 510, so that the whole command, the corpus's
preparation included, fits a one-GPU device call of nine minutes); without CUDA (or with ``--tiny``) both run their ``--tiny``
mode on the CPU, which is what the test suite runs. Writes ``<out>/gpu_checks.tar.gz`` holding each benchmark's
JSON, Markdown and log, and ``manifest.json`` (the commands, exit statuses, seconds, device, torch, commit).
Exit status 0 when every benchmark succeeded, 1 otherwise (the archive is written either way).

    # on the lent GPU machine (fairseq from carried wheels: scripts/device_setup.sh), carrying .whl and the data-bin
    source scripts/device_setup.sh .whl /tmp/site && python3 scripts/gpu_checks.py --out "$OUT" \\
        --data-bin data-bin/debian-ui-de-en/bin
    python scripts/gpu_checks.py --tiny --out /tmp/gpu-checks        # the CPU path, seconds
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
ARCHIVE = "gpu_checks.tar.gz"
#: The paper's IWSLT model at d=512 (transformer_iwslt_de_en) and its batches.
D512 = ["--layers", "6", "--embed-dim", "512", "--ffn-dim", "1024", "--heads", "4", "--max-tokens", "4096"]


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu-checks", help="folder of the archive "
                                                                                "(default: $OUT, else ./gpu-checks)")
    p.add_argument("--data-bin", help="a translation data-bin (default: the shipped corpus, prepared by "
                                      "bench_phase_e2e.py into --work-dir)")
    p.add_argument("--work-dir", help="where the corpus is prepared and the results are written (default: a "
                                      "temporary folder)")
    p.add_argument("--tiny", action="store_true", help="both benchmarks' --tiny mode on the CPU (also without CUDA)")
    p.add_argument("--budget", type=float, default=510.0, help="seconds for both benchmarks together on CUDA (the "
                                                                   "tiny CPU path gets --tiny-budget)")
    p.add_argument("--tiny-budget", type=float, default=3600.0, help="seconds for both tiny CPU runs together")
    return p


def plan(args, results: Path, work: Path, cuda: bool) -> List[dict]:
    """The benchmark commands: at d=512 on CUDA, else their tiny CPU runs."""
    e2e = [sys.executable, str(BENCH / "bench_phase_e2e.py"), "--out", str(results), "--work-dir", str(work)]
    phase = [sys.executable, str(BENCH / "bench_gpu_phase.py"), "--out", str(results)]
    if args.data_bin:
        e2e += ["--data-bin", args.data_bin]
        phase += ["--data-bin", args.data_bin]
    if not cuda:
        return [{"name": "phase_e2e", "argv": e2e + ["--tiny", "--device", "cpu"], "share": 0.5},
                {"name": "gpu_phase", "argv": phase + ["--tiny", "--device", "cpu"], "share": 0.5}]
    # a few dozen iterations and updates: a d=512 iteration in fp32 is a fraction of a second on such a GPU
    e2e += ["--device", "cuda", *D512, "--objective-iters", "16", "--constraint-iters", "16", "--switch-iters", "6",
            "--updates", "40", "--warmup-updates", "5", "--tag", "phase_e2e_cuda_d512"]
    phase += ["--device", "cuda", "--iters", "20", "--warmup", "3"]
    return [{"name": "phase_e2e", "argv": e2e, "share": 0.45}, {"name": "gpu_phase", "argv": phase, "share": 0.55}]


def run_step(step: dict, *, timeout: float, log: Path, env: dict) -> dict:
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        f.write("$ " + " ".join(step["argv"]) + "\n")
        f.flush()
        try:
            rc = subprocess.run(step["argv"], stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                                cwd=REPO, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = None
            f.write(f"\ngpu_checks: stopped after {timeout:.0f} s (its share of --budget)\n")
    return {"name": step["name"], "argv": [a.replace(str(REPO), ".") for a in step["argv"]], "returncode": rc,
            "seconds": round(time.perf_counter() - start, 1), "timeout_s": round(timeout, 1), "log": log.name}


def commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    args = get_args_parser().parse_args(argv)
    for name in ("budget", "tiny_budget"):
        if getattr(args, name) <= 0:
            print(f"gpu_checks.py: error: --{name.replace('_', '-')} {getattr(args, name):g}: give seconds > 0",
                  file=sys.stderr)
            return 2
    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-checks-") as tmp:
        work = Path(args.work_dir) if args.work_dir else Path(tmp)
        results = work / "results"
        results.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in os.environ.get(
            "PYTHONPATH", "").split(os.pathsep) if p]), "PYTHONUNBUFFERED": "1"}
        env.setdefault("OMP_NUM_THREADS", "1")
        start, steps, todo = time.perf_counter(), [], plan(args, results, work, cuda)
        budget = args.budget if cuda else args.tiny_budget
        for i, step in enumerate(todo):
            left = budget - (time.perf_counter() - start)
            # its share of the budget and whatever the steps before it left unused
            timeout = max(30.0, left - budget * sum(s["share"] for s in todo[i + 1:]))
            steps.append(run_step(step, timeout=timeout, log=results / f"{step['name']}.log", env=env))
            print(f"gpu_checks: {steps[-1]['name']} exit {steps[-1]['returncode']} in {steps[-1]['seconds']} s",
                  flush=True)
        manifest = {"device": torch.cuda.get_device_name() if cuda else "cpu (tiny)", "cuda": cuda,
                    "torch": torch.__version__, "commit": commit(), "budget_s": budget,
                    "seconds": round(time.perf_counter() - start, 1), "steps": steps}
        (results / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        with tarfile.open(out / ARCHIVE, "w:gz") as tar:
            for path in sorted(results.iterdir()):
                if path.is_file():
                    tar.add(path, arcname=f"gpu_checks/{path.name}")
    print(f"gpu_checks: wrote {out / ARCHIVE}")
    return 0 if all(s["returncode"] == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
