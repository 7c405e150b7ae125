"""The d=512 no-warmup runs of preset `hold` call A (lab/record/evidence/nowarmup-d512-holdA-2026-11-27/): the
table of lab/record/no-warmup.md, and its clamp rows in docs/remedies.md."""
from __future__ import annotations

from typing import List, Mapping, Optional

from .records import EVIDENCE, curves, monitor, study

HOLD_A = EVIDENCE / "nowarmup-d512-holdA-2026-11-27"
#: The arms, each with what it changes (the record's words).
HOLD_A_ARMS = {
    "ctl-fp16": "the scales, fp16",
    "fp32": "the same in fp32",
    "admin-ls": "fp16, window 256, threshold 2^-5",
    "clamp-strong": "LayerNorm ≥ 0.3, others ≥ 0.1",
    "clamp-mild": "LayerNorm ≥ 0.1, others ≥ 0.05",
}
#: An eval-mode loss on the monitor's fixed batch above its train-mode loss by more than this marks the
#: breakdown (before it the difference stays between -0.33 and +0.17 in every arm).
BREAKDOWN_GAP = 0.2
#: fp16 overflows once at start-up while the loss scale settles; the table counts the ones after it.
STARTUP_UPDATE = 3


def breakdown_onset(arm: str) -> Optional[int]:
    """The first monitored update at which the eval-mode loss on the fixed batch exceeds the train-mode loss by
    more than :data:`BREAKDOWN_GAP`; ``None`` if it never does."""
    for r in monitor(HOLD_A, arm):
        fixed = r.get("fixed_batch_loss") if r["type"] == "interval" else None
        if fixed and fixed["eval"] - fixed["train"] > BREAKDOWN_GAP:
            return r["update"]
    return None


def overflows(arm: str) -> List[int]:
    """The updates of ``arm``'s overflows after start-up."""
    return [r["update"] for r in monitor(HOLD_A, arm) if r["type"] == "overflow" and r["update"] > STARTUP_UPDATE]


def hold_a_table(arms: Mapping[str, str] = HOLD_A_ARMS) -> str:
    """Validation loss (eval mode) at 500, 1000 and 2000, the best and the last with their updates (a run that
    failed before its last update is marked crashed), the breakdown's onset and the overflows after start-up."""
    data, runs = curves(HOLD_A), study(HOLD_A)["arms"]
    lines = ["| arm | 500 | 1000 | 2000 | best | last | eval − train > 0.2 from | overflows |",
             "|---|---:|---:|---:|---|---|---:|---:|"]
    for arm, what in arms.items():
        valid = data[arm]["valid_loss"]
        best = min(valid, key=lambda u: (valid[u], u))
        last = max(valid)
        crashed = " (crashed)" if runs[arm]["ended_by"] == "failed" else ""
        onset = breakdown_onset(arm)
        cells = [f"`{arm}`: {what}", *(f"{valid[u]:.2f}" for u in (500, 1000, 2000)),
                 f"{valid[best]:.2f} @ {best}", f"{valid[last]:.2f} @ {last}{crashed}",
                 "–" if onset is None else str(onset), str(len(overflows(arm)))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


HOLD = EVIDENCE / "nowarmup-d512-hold-2026-11-27"
#: The earlier pair of runs (preset `confirm`): GradInit without warmup against Xavier with warmup.
HOLD_ARMS = {
    "gi98-s1": "GradInit, no warmup",
    "warm-s1": "Xavier, warmup 4000",
}
HOLD_UPDATES = (100, 300, 500, 900, 1000, 1500, 2000, 2300, 2500, 2700, 3000)


def crashed(arm: str) -> bool:
    """Whether ``arm``'s training of the earlier pair ended in an exception (this study kept no study.json)."""
    return "Traceback" in (HOLD / "logs" / arm / "train.log").read_text(encoding="utf-8")


def hold_table() -> str:
    """Validation loss (eval mode) of the earlier pair at :data:`HOLD_UPDATES`; an update after a crash says so."""
    data = curves(HOLD)
    lines = ["| updates | " + " | ".join(map(str, HOLD_UPDATES)) + " |", "|---|" + "---:|" * len(HOLD_UPDATES)]
    for arm, what in HOLD_ARMS.items():
        valid = data[arm]["valid_loss"]
        after = "crashed" if crashed(arm) else "–"
        cells = [f"{valid[u]:.2f}" if u in valid else after for u in HOLD_UPDATES]
        lines.append(f"| {what} (`{arm}`) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
