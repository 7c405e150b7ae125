"""Results of a study: curves, checkpoints, per-arm outcomes, export and the summary table."""
from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from fairseq_gradinit.files.paths import marked_tar_gz
from fairseq_gradinit.tools import curves as curve_logs

from .archive import ARM_FILES
from .archive import COMMAND as ARCHIVE_COMMAND
from .scheduler import Job

_CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")
_STOP_TIME_MSG = "Stopping training due to cumulative_training_time"


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------
CSV_FIELDS = ("arm", "num_updates", "valid_loss", "valid_nll_loss", "train_loss", "train_nll_loss",
              "loss_scale", "lr", "gnorm", "wall_s")
#: Columns added when an arm's save dir has the training monitor's ``monitor.jsonl``
#: (``--gradinit-monitor-interval``): its series, named as in :data:`~fairseq_gradinit.tools.curves.MONITOR_SERIES`.
MONITOR_FIELDS = tuple(curve_logs.MONITOR_SERIES)
#: The monitor's panels of ``curves.png``: (y label, series, log-scale y).
MONITOR_PANELS = (
    ("max LayerNorm gain |w|/std (fixed batch, eval)", "monitor_max_ln_gain_eval", True),
    ("max update/weight ratio of a group (last update)", "monitor_max_update_ratio", True),
    ("eval - train loss, fixed batch (bits)", "monitor_eval_train_gap", False),
    ("max self-attention logit (fixed batch, eval)", "monitor_max_attn_logit_eval", False),
    ("min self-attention entropy, nats (fixed batch, eval)", "monitor_min_attn_entropy_eval", False),
    ("max branch/residual norm ratio (fixed batch, eval)", "monitor_max_branch_ratio_eval", True),
)
MONITOR_JSONL = "monitor.jsonl"
#: The column added when an arm validated with dropout on as well (``--gradinit-valid-dropout-loss``).
DROPOUT_FIELD = "valid_loss_dropout"
#: The columns added when an arm validated with rolled sources (``--gradinit-source-gap``): the rolled loss
#: and the source gap (rolled minus plain, bits).
SOURCE_FIELDS = ("valid_loss_src_rolled", "valid_src_gap")


def arm_curves(log: Path) -> Dict[str, curve_logs.Curve]:
    """The curves of an arm's ``train.log``, and of the ``monitor.jsonl`` beside it if there is one."""
    if not log.is_file():
        return {}
    with open(log, encoding="utf-8", errors="replace") as f:
        curves = curve_logs.parse_training_log(f, valid_metrics=("loss", "nll_loss", "loss_dropout", "loss_src_rolled", "src_gap"))
    monitor = log.parent / MONITOR_JSONL
    if monitor.is_file():
        curves.update(curve_logs.parse_monitor_file(monitor))
    return curves


def has_monitor(curves: Mapping[str, curve_logs.Curve]) -> bool:
    return any(curves.get(k) for k in curve_logs.MONITOR_SERIES)


def curve_rows(name: str, curves: Mapping[str, curve_logs.Curve]) -> List[dict]:
    """One CSV row per logged update of one arm (validation, train_inner and, with a training monitor,
    its records merged)."""
    columns = {"valid_loss": "valid_loss", "valid_nll_loss": "valid_nll_loss", "train_loss": "train_loss",
               "train_nll_loss": "train_nll_loss", "loss_scale": "train_loss_scale", "lr": "train_lr",
               "gnorm": "train_gnorm", "wall_s": "train_wall"}
    if curves.get(DROPOUT_FIELD):
        columns[DROPOUT_FIELD] = DROPOUT_FIELD
    columns.update({f: f for f in SOURCE_FIELDS if curves.get(f)})
    if has_monitor(curves):
        columns.update({f: f for f in MONITOR_FIELDS})
    updates = sorted({u for c in curves.values() for u in c})
    return [{"arm": name, "num_updates": u, **{col: curves.get(key, {}).get(u, "") for col, key in columns.items()}}
            for u in updates]


def write_curves(out: Path, all_curves: Mapping[str, Mapping[str, curve_logs.Curve]]) -> Dict[str, str]:
    """``curves.csv``, ``curves.md`` (validation loss table) and ``curves.png``: three panels, and
    :data:`MONITOR_PANELS` from the training monitor when an arm has one."""
    written = {}
    csv_path = out / "curves.csv"
    monitored = any(has_monitor(c) for c in all_curves.values())
    dropout = {n: c.get(DROPOUT_FIELD, {}) for n, c in all_curves.items()}
    with_dropout = any(dropout.values())
    with_source = any(c.get(f) for c in all_curves.values() for f in SOURCE_FIELDS)
    fields = CSV_FIELDS + ((DROPOUT_FIELD,) if with_dropout else ()) + (SOURCE_FIELDS if with_source else ()) \
        + (MONITOR_FIELDS if monitored else ())
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        for name, curves in all_curves.items():
            w.writerows(curve_rows(name, curves))
    written["csv"] = str(csv_path)
    valid = {n: c.get("valid_loss", {}) for n, c in all_curves.items()}
    md = out / "curves.md"
    text = curve_logs.markdown_table(valid, "loss (eval mode)", "valid")
    if with_dropout:  # the breakdown shows as eval mode rising above dropout on
        text += "\n" + curve_logs.markdown_table(dropout, "loss (dropout on)", "valid")
    if with_source:  # a model that ignores its source keeps this near 0
        gaps = {n: c.get("valid_src_gap", {}) for n, c in all_curves.items()}
        text += "\n" + curve_logs.markdown_table(gaps, "source gap (rolled - plain loss, bits)", "valid")
    md.write_text(text, encoding="utf-8")
    written["md"] = str(md)
    png = out / "curves.png"
    panels = [("valid loss (eval mode)", valid, False)]
    if with_dropout:
        panels.append(("valid loss (dropout on)", dropout, False))
    if with_source:
        panels.append(("source gap, bits (rolled - plain valid loss)",
                       {n: c.get("valid_src_gap", {}) for n, c in all_curves.items()}, False))
    panels += [("train loss (dropout on)", {n: c.get("train_loss", {}) for n, c in all_curves.items()}, False),
               ("fp16 loss scale", {n: c.get("train_loss_scale", {}) for n, c in all_curves.items()}, True)]
    if monitored:
        panels += [(label, {n: c.get(key, {}) for n, c in all_curves.items()}, logy)
                   for label, key, logy in MONITOR_PANELS]
    if curve_logs.plot_panels(panels, png):
        written["png"] = str(png)
    return written


def checkpoint_updates(save_dir: Path) -> Dict[int, Path]:
    """``{update: path}`` of the interval checkpoints ``checkpoint_<epoch>_<update>.pt``."""
    out = {}
    if save_dir.is_dir():
        for p in save_dir.iterdir():
            m = _CHECKPOINT_RE.match(p.name)
            if m:
                out[int(m.group(2))] = p
    return out


def common_update(checkpoints: Mapping[str, Mapping[int, Path]]) -> Optional[int]:
    """The largest update at which every arm (with any checkpoint) saved one."""
    sets = [set(c) for c in checkpoints.values() if c]
    if not sets:
        return None
    common = set.intersection(*sets)
    return max(common) if common else None


def arm_outcome(job: Job, curves: Mapping[str, curve_logs.Curve], log: Path, max_update: int) -> dict:
    seen = [max(c) for c in curves.values() if c]
    last = max(seen) if seen else 0
    stopped = job.status
    if job.status == "done":
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        stopped = "stop_time" if _STOP_TIME_MSG in text else ("max_update" if last >= max_update else "done")
    valid = curves.get("valid_loss") or {}
    out = {"last_update": last, "ended_by": stopped, "last_valid_loss": valid[max(valid)] if valid else None}
    dropout = curves.get(DROPOUT_FIELD) or {}
    if dropout:
        out["last_valid_loss_dropout"] = dropout[max(dropout)]
    gap = curves.get("valid_src_gap") or {}
    if gap:
        out["last_src_gap"] = gap[max(gap)]
    return out


def export_results(out: Path, dest: Path, groups: Sequence[str], cache_dir: Path) -> List[str]:
    """Copy the summary files to ``dest`` and pack the logs (``logs.tar.gz``: every arm's
    :data:`~.archive.ARM_FILES`: logs, BLEU results, monitor records, scales) and the GradInit groups of this study
    (``gradinit.tar.gz``, to unpack into a ``--gradinit-cache`` folder): few files, no checkpoints."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("study.json", "curves.csv", "curves.png", "curves.md", "bleu.json"):
        if (out / name).is_file():
            shutil.copy2(out / name, dest / name)
            written.append(str(dest / name))
    with marked_tar_gz(dest / "logs.tar.gz", ARCHIVE_COMMAND) as tar:
        for arm_dir in sorted((out / "arms").iterdir()) if (out / "arms").is_dir() else []:
            for name in ARM_FILES:
                if (arm_dir / name).is_file():
                    tar.add(arm_dir / name, arcname=f"{arm_dir.name}/{name}")
    written.append(str(dest / "logs.tar.gz"))
    with marked_tar_gz(dest / "gradinit.tar.gz", ARCHIVE_COMMAND) as tar:
        for g in groups:
            for path in (cache_dir / g, cache_dir / f"failed-{g}"):
                if path.is_dir():
                    tar.add(path, arcname=path.name)
    written.append(str(dest / "gradinit.tar.gz"))
    return written


def summary_table(result: Mapping) -> str:
    """A short text table: per arm, how it ended, its last update, last validation loss and BLEU."""
    lines = ["arm | ended by | last update | valid loss (last) | BLEU"]
    bleu = (result.get("bleu") or {}).get("arms", {})
    for name, a in result["arms"].items():
        if not a.get("trained"):
            continue
        b = bleu.get(name, {}).get("bleu")
        lines.append(f"{name} | {a.get('ended_by')} | {a.get('last_update')} | {a.get('last_valid_loss', '–')} | "
                     f"{'–' if b is None else f'{b:.2f}'}")
    update = (result.get("bleu") or {}).get("update")
    if update is not None:
        lines.append(f"(BLEU at update {update}, the largest checkpoint every arm reached)")
    return "\n".join(lines)
