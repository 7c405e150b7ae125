#!/usr/bin/env python3
"""Validation-loss curves from fairseq-train logs: JSON, Markdown table and (optionally) PNG.

fairseq-train prints one line per validation, through the logger named after the subset:

    simple/tqdm log format (default):
      YYYY-MM-DD hh:mm:ss | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.84 | \
nll_loss 9.65 | ppl 803.2 | wps 5012 | wpb 2901 | bsz 110 | num_updates 100 | best_loss 9.84
    --log-format json:
      YYYY-MM-DD hh:mm:ss | INFO | valid | {"epoch": 1, "valid_loss": "9.84", ..., \
"valid_num_updates": "100", "valid_best_loss": "9.84"}

Both forms are recognised. Usage::

    python scripts/plot_curves.py --run baseline=runs/base/train.log \\
        --run gradinit=runs/gi/train.log --out runs/curves

writes runs/curves.json ({label: {update: loss}}), runs/curves.md and, when matplotlib is
importable, runs/curves.png. If a log holds the same update twice (a resumed run appended to
the same file), the later value wins.

``--monitor LABEL=PATH`` adds a run's training monitor (``monitor.jsonl`` of
``--gradinit-monitor-interval``): its series go into the JSON (``runs[LABEL]["monitor"]``) and the PNG
gets three more panels (loss scale, largest LayerNorm gain in eval mode, largest update ratio).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from ..command_line.argtypes import output_prefix
from ..command_line.quiet import quiet_command
from ..files.paths import OutputError, check_output, header_line, json_result, png_output, text_output, write_json

# The parsing and plotting live beside this command in .curves (shared with the research lab's study runner);
# importing fairseq_gradinit.tools.curves needs neither torch nor fairseq.
from .curves import (  # noqa: F401  (re-exported: this module's API)
    Curve,
    log_file_problem,
    markdown_table,
    monitor_file_problem,
    parse_log,
    parse_log_file,
    parse_monitor_file,
    parse_stats_pipes,
    parse_train_inner_line,
    parse_valid_line,
    plot_panels,
    plot_png,
)

COMMAND = "gradinit-plot-curves"

#: The monitor panels of the PNG: (y label, series, log scale).
MONITOR_PANELS = (("loss scale (monitor)", "monitor_loss_scale", True),
                  ("max LayerNorm gain (fixed batch, eval)", "monitor_max_ln_gain_eval", True),
                  ("max update/weight ratio (last update)", "monitor_max_update_ratio", True),
                  ("eval - train loss, fixed batch (bits)", "monitor_eval_train_gap", False),
                  ("max self-attention logit (fixed batch, eval)", "monitor_max_attn_logit_eval", False),
                  ("max branch/residual norm ratio (fixed batch, eval)", "monitor_max_branch_ratio_eval", True))


def parse_run_spec(spec: str) -> Tuple[str, Path]:
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--run expects LABEL=PATH, got {spec!r}")
    return label, Path(path)


def curves_to_json(curves: Dict[str, Curve], metric: str, subset: str,
                   sources: Dict[str, str], monitors: Optional[Dict[str, Dict[str, Curve]]] = None) -> dict:
    runs = {label: {"log": sources.get(label), "curve": {str(u): v for u, v in curve.items()}}
            for label, curve in curves.items()}
    for label, series in (monitors or {}).items():
        # JSON has no inf/NaN: such values are written as strings, as in monitor.jsonl
        runs[label]["monitor"] = {k: {str(u): (v if math.isfinite(v) else str(v)) for u, v in c.items()}
                                  for k, c in series.items()}
    return {"metric": metric, "subset": subset, "runs": runs}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Extract validation curves (update -> loss) from fairseq-train logs and "
                    "write JSON, a Markdown table and a PNG plot (if matplotlib is available).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--run", action="append", required=True, type=parse_run_spec,
                   metavar="LABEL=PATH",
                   help="a run label and its fairseq-train log file; repeat for several runs")
    p.add_argument("--monitor", action="append", default=[], type=parse_run_spec, metavar="LABEL=PATH",
                   help="a run label (one of --run) and the monitor.jsonl its --gradinit-monitor-interval wrote")
    p.add_argument("--out", type=output_prefix, default=Path("curves"),
                   help="output prefix: writes PREFIX.json, PREFIX.md and PREFIX.png")
    p.add_argument("--metric", default="loss",
                   help="validation statistic to extract (loss, nll_loss, ppl, ...)")
    p.add_argument("--subset", default="valid", help="validation subset name")
    p.add_argument("--logy", action="store_true", help="log-scale y axis in the plot")
    p.add_argument("--no-png", action="store_true", help="do not draw the PNG plot")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    labels = [label for label, _ in args.run]
    if len(set(labels)) != len(labels):
        print(f"error: duplicate run labels in {labels}", file=sys.stderr)
        return 2
    curves: Dict[str, Curve] = {}
    sources: Dict[str, str] = {}
    for label, path in args.run:
        if not path.is_file():
            print(f"error: log file not found for run {label!r}: {path}", file=sys.stderr)
            return 1
        problem = log_file_problem(path)
        if problem:
            print(f"error: --run {label}={path} is not a fairseq-train log: {problem}; give the log fairseq-train "
                  "printed (e.g. its stdout saved with tee)", file=sys.stderr)
            return 2
        curves[label] = parse_log_file(path, metric=args.metric, subset=args.subset)
        sources[label] = str(path)
        if not curves[label]:
            print(f"warning: no '{args.subset}' {args.metric} entries found in {path}",
                  file=sys.stderr)

    monitors: Dict[str, Dict[str, Curve]] = {}
    for label, path in args.monitor:
        if label not in curves:
            print(f"error: --monitor {label}: no --run with that label (runs: {', '.join(labels)})", file=sys.stderr)
            return 2
        if not path.is_file():
            print(f"error: monitor file not found for run {label!r}: {path}", file=sys.stderr)
            return 1
        problem = monitor_file_problem(path)
        if problem:
            print(f"error: --monitor {label}={path} is not a monitor.jsonl of --gradinit-monitor-interval: {problem}; "
                  "give the monitor.jsonl in the run's --save-dir", file=sys.stderr)
            return 2
        monitors[label] = parse_monitor_file(path)

    out: Path = args.out
    json_path = out.with_name(out.name + ".json")
    md_path = out.with_name(out.name + ".md")
    png_path = out.with_name(out.name + ".png")
    inputs = {"--run": [path for _, path in args.run], "--monitor": [path for _, path in args.monitor]}
    try:
        for path, kind in ((json_path, json_result("curves of gradinit-plot-curves", "metric", "runs", command=COMMAND)),
                           (md_path, text_output("a table of gradinit-plot-curves", COMMAND, markdown=True)),
                           (png_path, png_output(COMMAND))):
            check_output("--out", path, kind, inputs=inputs)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)

    write_json(json_path, curves_to_json(curves, args.metric, args.subset, sources, monitors), command=COMMAND,
               indent=2)
    table = markdown_table(curves, args.metric, args.subset)
    md_path.write_text(header_line(COMMAND, markdown=True) + "\n" + table, encoding="utf-8")
    print(table)
    written = [json_path, md_path]
    if monitors:
        panels = [(f"{args.subset} {args.metric}", curves, args.logy)]
        panels += [(name, {label: m.get(key, {}) for label, m in monitors.items()}, logy)
                   for name, key, logy in MONITOR_PANELS]
        if not args.no_png and plot_panels(panels, png_path, command=COMMAND):
            written.append(png_path)
    elif not args.no_png and plot_png(curves, png_path, args.metric, args.subset, args.logy, command=COMMAND):
        written.append(png_path)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


run = quiet_command(main, COMMAND)


if __name__ == "__main__":
    sys.exit(run())
