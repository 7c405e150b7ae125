#!/usr/bin/env python3
"""Validation-loss curves from fairseq-train logs: JSON, Markdown table and (optionally) PNG.

fairseq-train prints one line per validation, through the logger named after the subset:

    simple/tqdm log format (default):
      2024-01-01 12:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.84 | \
nll_loss 9.65 | ppl 803.2 | wps 5012 | wpb 2901 | bsz 110 | num_updates 100 | best_loss 9.84
    --log-format json:
      2024-01-01 12:00:00 | INFO | valid | {"epoch": 1, "valid_loss": "9.84", ..., \
"valid_num_updates": "100", "valid_best_loss": "9.84"}

Both forms are recognised. Usage::

    python scripts/plot_curves.py --run baseline=runs/base/train.log \\
        --run gradinit=runs/gi/train.log --out runs/curves

writes runs/curves.json ({label: {update: loss}}), runs/curves.md and, when matplotlib is
importable, runs/curves.png. If a log holds the same update twice (a resumed run appended to
the same file), the later value wins.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

Curve = Dict[int, float]

_SIMPLE_RE = re.compile(r"valid on '(?P<subset>[^']+)' subset \| (?P<stats>.*)$")
_JSON_RE = re.compile(r"\| (?P<tag>[^|]+?) \| (?P<payload>\{.*\})\s*$")


def _to_float(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def parse_stats_pipes(stats: str) -> Dict[str, str]:
    """``"loss 9.84 | nll_loss 9.65 | num_updates 100"`` -> ``{"loss": "9.84", ...}``."""
    out = {}
    for item in stats.split(" | "):
        item = item.strip()
        if not item:
            continue
        key, _, value = item.partition(" ")
        out[key] = value.strip()
    return out


def parse_valid_line(line: str, subset: str = "valid") -> Optional[Dict[str, str]]:
    """Return the stats of a validation line for ``subset`` (keys without prefix), else None."""
    m = _SIMPLE_RE.search(line)
    if m:
        if m.group("subset") != subset:
            return None
        return parse_stats_pipes(m.group("stats"))
    m = _JSON_RE.search(line)
    if m and m.group("tag").strip() == subset:
        try:
            payload = json.loads(m.group("payload"))
        except json.JSONDecodeError:
            return None
        prefix = subset + "_"
        stats = {k[len(prefix):]: str(v) for k, v in payload.items() if k.startswith(prefix)}
        return stats or None
    return None


def parse_log(lines: Iterable[str], metric: str = "loss", subset: str = "valid") -> Curve:
    """Map num_updates -> metric for every validation of ``subset`` in a fairseq-train log."""
    curve: Curve = {}
    for line in lines:
        stats = parse_valid_line(line.rstrip("\n"), subset)
        if not stats:
            continue
        update = _to_float(stats.get("num_updates"))
        value = _to_float(stats.get(metric))
        if update is None or value is None:
            continue
        curve[int(update)] = value
    return dict(sorted(curve.items()))


def parse_log_file(path: Path, metric: str = "loss", subset: str = "valid") -> Curve:
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_log(f, metric=metric, subset=subset)


def parse_run_spec(spec: str) -> Tuple[str, Path]:
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"--run expects LABEL=PATH, got {spec!r}")
    return label, Path(path)


def _fmt(value: Optional[float]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.3f}"


def markdown_table(curves: Dict[str, Curve], metric: str = "loss", subset: str = "valid") -> str:
    """Rows = update counts (union over runs), columns = runs, plus best/final summary rows."""
    labels = list(curves)
    updates = sorted({u for c in curves.values() for u in c})
    header = "| updates | " + " | ".join(labels) + " |"
    sep = "|---:|" + "---:|" * len(labels)
    rows = [header, sep]
    for u in updates:
        rows.append(f"| {u} | " + " | ".join(_fmt(curves[l].get(u)) for l in labels) + " |")
    best, final = [], []
    for l in labels:
        c = curves[l]
        if c:
            bu = min(c, key=lambda u: c[u])
            best.append(f"{c[bu]:.3f} @ {bu}")
            lu = max(c)
            final.append(f"{c[lu]:.3f} @ {lu}")
        else:
            best.append("–")
            final.append("–")
    rows.append("| **best** | " + " | ".join(best) + " |")
    rows.append("| **last** | " + " | ".join(final) + " |")
    title = f"{subset} {metric} by number of updates"
    return f"{title}\n\n" + "\n".join(rows) + "\n"


def curves_to_json(curves: Dict[str, Curve], metric: str, subset: str,
                   sources: Dict[str, str]) -> dict:
    return {
        "metric": metric,
        "subset": subset,
        "runs": {
            label: {
                "log": sources.get(label),
                "curve": {str(u): v for u, v in curve.items()},
            }
            for label, curve in curves.items()
        },
    }


def plot_png(curves: Dict[str, Curve], path: Path, metric: str, subset: str,
             logy: bool = False) -> bool:
    """Plot with matplotlib; returns False (and says so) when matplotlib is unavailable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the PNG plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, curve in curves.items():
        if curve:
            ax.plot(list(curve), list(curve.values()), marker="o", markersize=3, label=label)
    ax.set_xlabel("updates")
    ax.set_ylabel(f"{subset} {metric}")
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Extract validation curves (update -> loss) from fairseq-train logs and "
                    "write JSON, a Markdown table and a PNG plot (if matplotlib is available).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--run", action="append", required=True, type=parse_run_spec,
                   metavar="LABEL=PATH",
                   help="a run label and its fairseq-train log file; repeat for several runs")
    p.add_argument("--out", type=Path, default=Path("curves"),
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
        curves[label] = parse_log_file(path, metric=args.metric, subset=args.subset)
        sources[label] = str(path)
        if not curves[label]:
            print(f"warning: no '{args.subset}' {args.metric} entries found in {path}",
                  file=sys.stderr)

    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out.with_name(out.name + ".json")
    md_path = out.with_name(out.name + ".md")
    png_path = out.with_name(out.name + ".png")

    json_path.write_text(
        json.dumps(curves_to_json(curves, args.metric, args.subset, sources), indent=2) + "\n",
        encoding="utf-8",
    )
    table = markdown_table(curves, args.metric, args.subset)
    md_path.write_text(table, encoding="utf-8")
    print(table)
    written = [json_path, md_path]
    if not args.no_png and plot_png(curves, png_path, args.metric, args.subset, args.logy):
        written.append(png_path)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
