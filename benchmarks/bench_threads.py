"""Wall time of a command with PyTorch's default threads and with ``OMP_NUM_THREADS=1``, on an idle machine and
with one core kept busy by another process, runs interleaved (default, 1, default, 1, ...) so that a change
in the machine's load hits both settings alike. Writes one JSON with every run's time, the load average
before each run and the conditions.

    python benchmarks/bench_threads.py --out docs/threads-quickstart.json --repeat 2 -- \\
        gradinit-compare-vision --steps 40 --gradinit-iters 8 --test-batches 2 --output-dir /tmp/threads
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SETTINGS = {"default threads": None, "OMP_NUM_THREADS=1": "1"}


def timed_run(cmd: Sequence[str], threads: Optional[str], log: Path) -> float:
    """Seconds of ``cmd`` with ``OMP_NUM_THREADS`` set to ``threads`` (unset for None); its output to ``log``."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(list(cmd), env=env, stdout=f, stderr=subprocess.STDOUT)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with status {proc.returncode}; see {log}")
    return elapsed


def measure(cmd: Sequence[str], *, repeat: int, busy: bool, logs: Path) -> List[Dict]:
    """Interleaved runs of every setting; with ``busy`` a process spins on one core meanwhile."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    rows = []
    try:
        for i in range(repeat):
            for name, threads in SETTINGS.items():
                load = os.getloadavg()[0]
                log = logs / f"{'busy' if busy else 'idle'}-{i}-{threads or 'default'}.log"
                seconds = timed_run(cmd, threads, log)
                rows.append({"setting": name, "one_core_busy": busy, "repeat": i, "seconds": seconds,
                             "load_average_1min_before": load})
                print(f"{'one core busy' if busy else 'no extra load'} | {name:<18} | {seconds:7.1f}s | load "
                      f"{load:.1f} before", flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    return rows


def summarize(rows: List[Dict]) -> Dict[str, float]:
    """Mean seconds of default threads over mean seconds of one thread, per load condition."""
    out = {}
    for busy in (False, True):
        mean = {}
        for name in SETTINGS:
            times = [r["seconds"] for r in rows if r["one_core_busy"] == busy and r["setting"] == name]
            if times:
                mean[name] = sum(times) / len(times)
        if len(mean) == 2:
            out["one core busy" if busy else "no extra load"] = mean["default threads"] / mean["OMP_NUM_THREADS=1"]
    return out


def markdown(result: Dict) -> str:
    """The runs as a Markdown table: mean seconds per setting and load condition, and their ratio."""
    lines = ["| other load | default threads | `OMP_NUM_THREADS=1` | default / one thread |", "|---|---|---|---|"]
    for busy, label in ((False, "no extra load"), (True, "one core busy")):
        times = {name: [r["seconds"] for r in result["runs"] if r["one_core_busy"] == busy and r["setting"] == name]
                 for name in SETTINGS}
        if all(times.values()):
            mean = {name: sum(t) / len(t) for name, t in times.items()}
            lines.append(f"| {label} | {mean['default threads']:.0f} s | {mean['OMP_NUM_THREADS=1']:.0f} s | "
                         f"{result['default_over_one_thread'][label]:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the JSON to write")
    p.add_argument("--repeat", type=int, default=1, help="runs of each setting per load condition")
    p.add_argument("--no-busy", action="store_true", help="skip the runs with one core kept busy")
    p.add_argument("--note", default="", help="a sentence on the conditions, stored in the JSON")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command to time")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("give the command to time after --")
    out = Path(args.out)
    logs = out.with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    rows = measure(cmd, repeat=args.repeat, busy=False, logs=logs)
    if not args.no_busy:
        rows += measure(cmd, repeat=args.repeat, busy=True, logs=logs)
    result = {"command": cmd, "cpu_count": os.cpu_count(), "python": platform.python_version(),
              "machine": platform.machine(), "note": args.note, "runs": rows,
              "default_over_one_thread": summarize(rows)}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"default threads / one thread: {result['default_over_one_thread']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
