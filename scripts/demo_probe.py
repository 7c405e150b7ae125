#!/usr/bin/env python3
"""A tripwire for the stored payoff demo (docs/compare-vision.json): the same command path at a tiny size on
synthetic images, whose numbers are stored in tests/data/compare-vision-probe.json with the checksum of the
stored demo they go with.

A code change that changes what the demo computes (its data order, augmentation, model, initialization,
GradInit, training loop) changes the tiny run's numbers by far more than another CPU's rounding does over a
few steps, so the test fails until the demo is run again and stored with its probe:

    OMP_NUM_THREADS=1 gradinit-compare-vision --output-dir runs/compare-vision \\
        --json docs/compare-vision.json --plot docs/compare-vision.png
    python scripts/demo_probe.py --write     # refuses while docs/compare-vision.json is the old run
    python scripts/demo_probe.py --check     # exit 1 when the probe is out of date (the tests run it)

Rounding alone (another CPU, other kernels) does not trip it, but 120 training steps grow it into other
accuracies: the spread of those is stated in docs/quickstart-vision.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "docs" / "compare-vision.json"
PROBE = REPO / "tests" / "data" / "compare-vision-probe.json"
#: The tiny run: gradinit-compare-vision's defaults cut to seconds, on synthetic images (no data package).
ARGV = ["--dataset", "synthetic", "--synthetic-train-size", "96", "--synthetic-test-size", "32", "--width", "0.125",
        "--batch-size", "8", "--steps", "6", "--gradinit-iters", "3", "--test-batches", "2", "--test-batch-size",
        "16", "--log-interval", "2", "--threads", "1", "--no-progress"]
#: Relative tolerance: rounding differences between kernels stay below 1e-4 in the numbers compared (:func:`numbers`);
#: a changed computation (other batches, initial weights, augmentation or scales) moves them by far more.
RTOL = 1e-3


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def numbers(result: dict) -> dict:
    """The numbers of a comparison that the probe compares: each run's mean training loss over its first
    ``--log-interval`` steps, GradInit's branches and ||g|| at its first iteration. Later numbers are left out:
    even at this size, other kernels on the same CPU move the loss at step 6 by up to 1e-2 and an untrained
    network's test loss by a factor of 2 (measured with DNNL_MAX_CPU_ISA=SSE41 and ATEN_CPU_CAPABILITY=default),
    while these moved by less than 1e-4."""
    out = {}
    for init, run in result["runs"].items():
        out[init] = {"first_loss": run["curve"][0]["loss"], "branches": run["gradinit_iterations"],
                     "first_grad_norm": (run.get("phase") or {}).get("first_grad_norm")}
    return out


def run_probe() -> dict:
    """The tiny comparison's full record (the same format as the stored demo's)."""
    from fairseq_gradinit.tools import compare_vision

    with tempfile.TemporaryDirectory(prefix="demo-probe-") as tmp:
        args, extra = compare_vision.get_args_parser().parse_known_args([*ARGV, "--output-dir", tmp])
        return compare_vision.compare(args, extra)


def differences(fresh: dict, stored: dict, rtol: float = RTOL) -> list:
    """Where two :func:`numbers` records differ beyond ``rtol`` (one line each)."""
    out = []

    def walk(a, b, where):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{where}.{k}")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{where}[{i}]")
        elif isinstance(a, float) and isinstance(b, (int, float)):
            if not math.isclose(a, b, rel_tol=rtol):
                out.append(f"{where}: {a:.6g} now, {b:.6g} stored")
        elif a != b:
            out.append(f"{where}: {a!r} now, {b!r} stored")

    walk(fresh, stored, "runs")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="store the probe of the demo now in docs/compare-vision.json")
    g.add_argument("--check", action="store_true", help="exit 1 when the probe or the stored demo is out of date")
    args = p.parse_args(argv)
    fresh = numbers(run_probe())
    old = json.loads(PROBE.read_text(encoding="utf-8")) if PROBE.exists() else None
    diff = differences(fresh, old["runs"]) if old else ["no probe stored"]
    stored_sha = sha256(STORED)
    if args.check:
        if diff:
            print("demo_probe: the demo's code path computes other numbers than when docs/compare-vision.json was "
                  f"stored ({'; '.join(diff[:3])}); rerun the demo and then python scripts/demo_probe.py --write "
                  "(see its docstring)", file=sys.stderr)
            return 1
        if old["stored_sha256"] != stored_sha:
            print("demo_probe: docs/compare-vision.json is not the run this probe was stored with; run python "
                  "scripts/demo_probe.py --write", file=sys.stderr)
            return 1
        return 0
    if diff and old and old["stored_sha256"] == stored_sha:
        print("demo_probe: the numbers changed but docs/compare-vision.json is still the old run; rerun the demo "
              "first (see this script's docstring)", file=sys.stderr)
        return 1
    PROBE.write_text(json.dumps({"argv": ARGV, "rtol": RTOL, "stored_sha256": stored_sha, "runs": fresh}, indent=1)
                     + "\n", encoding="utf-8")
    print(f"updated: {PROBE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
