"""Training curves from fairseq-train logs: validation and ``train_inner`` statistics by update.

Pure Python (no torch, no fairseq), shared by ``scripts/plot_curves.py`` and the study runner
of the research lab (``lab.study``). fairseq-train prints, through loggers named after
the subset:

    simple/tqdm log format (default):
      ... | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.84 | nll_loss 9.65 | \
ppl 803.2 | wps 5012 | wpb 2901 | bsz 110 | num_updates 100 | best_loss 9.84
      ... | INFO | train_inner | epoch 001:    101 / 187 loss=10.191, nll_loss=9.784, ..., \
num_updates=100, lr=0.0005, gnorm=0.604, loss_scale=64, train_wall=39, gb_free=138.2, wall=46
    --log-format json:
      ... | INFO | valid | {"epoch": 1, "valid_loss": "9.84", ..., "valid_num_updates": "100"}
      ... | INFO | train_inner | {"epoch": 1, "update": 0.54, "loss": "10.191", ..., "num_updates": "100"}

Validation statistics are fairseq's own, computed in eval mode (dropout off); ``train_inner``
statistics are averages over the last ``--log-interval`` updates, with dropout on. The training
monitor's ``monitor.jsonl`` (``--gradinit-monitor-interval``) gives further curves
(:func:`parse_monitor`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..files.paths import png_metadata

Curve = Dict[int, float]

_SIMPLE_RE = re.compile(r"valid on '(?P<subset>[^']+)' subset \| (?P<stats>.*)$")
_JSON_RE = re.compile(r"\| (?P<tag>[^|]+?) \| (?P<payload>\{.*\})\s*$")
_TRAIN_INNER_RE = re.compile(r"\| train_inner \| (?P<rest>.*)$")
_KEY_EQ_VALUE_RE = re.compile(r"(?P<key>[A-Za-z_][\w]*)=(?P<value>[^,\s]+)")


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


def parse_train_inner_line(line: str) -> Optional[Dict[str, str]]:
    """Return the stats of a ``train_inner`` line (``loss``, ``num_updates``, ``loss_scale``, ...)."""
    m = _TRAIN_INNER_RE.search(line)
    if not m:
        return None
    rest = m.group("rest").strip()
    if rest.startswith("{"):
        try:
            payload = json.loads(rest)
        except json.JSONDecodeError:
            return None
        return {k: str(v) for k, v in payload.items()} or None
    stats = {m2.group("key"): m2.group("value") for m2 in _KEY_EQ_VALUE_RE.finditer(rest)}
    return stats or None


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


def parse_training_log(lines: Iterable[str], *, subset: str = "valid",
                       valid_metrics: Sequence[str] = ("loss", "nll_loss"),
                       train_metrics: Sequence[str] = ("loss", "nll_loss", "loss_scale", "lr", "gnorm", "wall"),
                       ) -> Dict[str, Curve]:
    """Every curve of one log in one pass: ``{"valid_loss": {update: value}, "train_loss": ..., ...}``.

    Keys are ``valid_<metric>`` and ``train_<metric>``; a metric absent from the log (e.g.
    ``loss_scale`` of an fp32 run) gives an empty curve. A repeated update (a resumed run appended
    to the same log) keeps the later value.
    """
    curves: Dict[str, Curve] = {f"valid_{k}": {} for k in valid_metrics}
    curves.update({f"train_{k}": {} for k in train_metrics})
    for raw in lines:
        line = raw.rstrip("\n")
        stats = parse_valid_line(line, subset)
        prefix, metrics = "valid_", valid_metrics
        if stats is None:
            stats = parse_train_inner_line(line)
            prefix, metrics = "train_", train_metrics
        if not stats:
            continue
        update = _to_float(stats.get("num_updates"))
        if update is None:
            continue
        for k in metrics:
            value = _to_float(stats.get(k))
            if value is not None:
                curves[prefix + k][int(update)] = value
    return {k: dict(sorted(v.items())) for k, v in curves.items()}


#: The series of a training monitor's ``monitor.jsonl`` (``--gradinit-monitor-interval``) that curves
#: plot, by key (``monitor_<name>``) and where an ``interval`` record holds them.
MONITOR_SERIES = {
    "monitor_loss_scale": ("loss_scale",),
    "monitor_overflows": ("overflows",),
    "monitor_skipped_updates": ("skipped_updates",),
    "monitor_fixed_loss_eval": ("fixed_batch_loss", "eval"),
    "monitor_fixed_loss_train": ("fixed_batch_loss", "train"),
    "monitor_max_update_ratio": ("summary", "max_update_ratio"),
    "monitor_max_ln_gain_eval": ("summary", "max_ln_gain_eval"),
    "monitor_max_ln_gain_train": ("summary", "max_ln_gain_train"),
    "monitor_min_ln_input_std_eval": ("summary", "min_ln_input_std_eval"),
    "monitor_min_ln_input_std_train": ("summary", "min_ln_input_std_train"),
    "monitor_eval_train_gap": ("eval_train_gap", "gap"),
    "monitor_max_attn_logit_eval": ("summary", "max_attn_logit_eval"),
    "monitor_max_attn_logit_train": ("summary", "max_attn_logit_train"),
    "monitor_min_attn_entropy_eval": ("summary", "min_attn_entropy_eval"),
    "monitor_min_attn_entropy_train": ("summary", "min_attn_entropy_train"),
    "monitor_max_branch_ratio_eval": ("summary", "max_branch_ratio_eval"),
    "monitor_max_branch_ratio_train": ("summary", "max_branch_ratio_train"),
}
#: Panels per row of a figure: more panels wrap into further rows.
PANELS_PER_ROW = 4


def parse_monitor(lines: Iterable[str]) -> Dict[str, Curve]:
    """The :data:`MONITOR_SERIES` of a ``monitor.jsonl``, each ``{update: value}`` from its ``interval``
    records ("inf"/"nan" strings become floats). A repeated update (a run resumed from an earlier
    checkpoint appends to the same file) keeps the later record; unreadable lines are skipped."""
    curves: Dict[str, Curve] = {k: {} for k in MONITOR_SERIES}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or record.get("type") != "interval":
            continue
        update = _to_float(record.get("update"))
        if update is None:
            continue
        for key, path in MONITOR_SERIES.items():
            value = record
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            value = _to_float(value)
            if value is not None:
                curves[key][int(update)] = value
    return {k: dict(sorted(v.items())) for k, v in curves.items()}


def parse_monitor_file(path: Path) -> Dict[str, Curve]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_monitor(f)


#: The start of every line fairseq's logging writes ("YYYY-MM-DD hh:mm:ss | INFO | name | ...").
_FAIRSEQ_LOG_LINE_RE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| [\w.]+ \| ")
#: The record types of ``monitor.jsonl`` (docs/monitor.md); a file with none of them is another kind.
MONITOR_TYPES = ("start", "interval", "overflow")


def log_file_problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a fairseq-train log (no line in fairseq's logging format), or None."""
    with open(path, encoding="utf-8", errors="replace") as f:
        if any(_FAIRSEQ_LOG_LINE_RE.match(line) for line in f):
            return None
    return "no line of it is in fairseq's logging format ('DATE TIME | LEVEL | NAME | ...')"


def monitor_file_problem(path: Path) -> Optional[str]:
    """Why ``path`` is not a ``monitor.jsonl`` of the training monitor (no record with a ``type`` of
    :data:`MONITOR_TYPES`, or a ``start`` record without the ``version`` that wrote it), or None."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict) or record.get("type") not in MONITOR_TYPES:
                continue
            if record["type"] == "start" and "version" not in record:
                return f"its start record (line {n}) has no 'version'"
            return None
    return f"no line of it is a monitor record (a JSON object whose 'type' is one of {', '.join(MONITOR_TYPES)})"


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
        rows.append(f"| {u} | " + " | ".join(_fmt(curves[label].get(u)) for label in labels) + " |")
    best, final = [], []
    for label in labels:
        c = curves[label]
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


def plot_panels(panels: Sequence[Tuple[str, Dict[str, Curve], bool]], path: Path, *,
                title: Optional[str] = None, command: Optional[str] = None) -> bool:
    """One figure, one panel per ``(y label, {run: curve}, log-scale y)``, runs in the same colours
    across panels. ``command``: the command whose mark the PNG carries (:func:`~..files.paths.png_metadata`).
    Returns False (and says so) when matplotlib is unavailable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the PNG plot", file=sys.stderr)
        return False
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
    n = len(panels)
    cols = min(n, PANELS_PER_ROW)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 if n == 1 else 5.2 * cols, 4.5 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    labels: List[str] = []
    for _, curves, _ in panels:
        labels += [label for label in curves if label not in labels]
    colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for ax, (ylabel, curves, logy) in zip(axes.flat, panels):
        for label, curve in curves.items():
            curve = {u: v for u, v in curve.items() if math.isfinite(v)}
            if curve:
                ax.plot(list(curve), list(curve.values()), marker="o", markersize=3, label=label,
                        color=colours[label])
        ax.set_xlabel("updates")
        ax.set_ylabel(ylabel)
        if logy and any(0 < v < math.inf for c in curves.values() for v in c.values()):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if any(curves.values()):
            ax.legend(fontsize=7 if len(curves) > 6 else 9)
        else:  # e.g. the loss scale of fp32 runs: fairseq logs none
            ax.text(0.5, 0.5, "not in the logs", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata=png_metadata(command) if command else None)
    plt.close(fig)
    return True


def plot_png(curves: Dict[str, Curve], path: Path, metric: str, subset: str,
             logy: bool = False, *, command: Optional[str] = None) -> bool:
    """One metric of several runs (``plot_panels`` with a single panel)."""
    return plot_panels([(f"{subset} {metric}", curves, logy)], path, command=command)
