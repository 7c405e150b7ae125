"""The health check's measurements of the authors' d=512 scales (docs/health-authors-d512.json): docs/health.md's
worked example, and docs/remedies.md's table of what clamping changes (docs/remedies/health-clamp-mild.json,
docs/remedies/health-clamp-strong.json)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from .records import REPO

DOCS = REPO / "docs"
#: Each row's label and the health record it quotes.
CLAMP_ROWS = {
    "as learned": DOCS / "health-authors-d512.json",
    "clamped mild: LayerNorm ≥ 0.1, others ≥ 0.05": DOCS / "remedies" / "health-clamp-mild.json",
    "clamped strong: LayerNorm ≥ 0.3, others ≥ 0.1": DOCS / "remedies" / "health-clamp-strong.json",
}
#: How many of the learned scales' largest LayerNorm gains get a column.
GAIN_COLUMNS = 3


def health_of(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["health"]


def _gains(h: dict) -> Dict[str, float]:
    return {n["name"]: n["gain_after"] for n in h["norms"] if isinstance(n.get("gain_after"), float)}


def clamp_columns(learned: dict) -> List[str]:
    """The LayerNorms with the largest gains after the learned scales: the ones clamping is meant to calm."""
    gains = _gains(learned)
    return sorted(gains, key=lambda n: -gains[n])[:GAIN_COLUMNS]


def clamp_health_table() -> str:
    records = {label: health_of(path) for label, path in CLAMP_ROWS.items()}
    cols = clamp_columns(records["as learned"])
    lines = ["| scales | weights at the floor | " + " | ".join(f"`{c}`" for c in cols) + " | verdict |",
             "|---|---:|" + "---:|" * len(cols) + "---|"]
    for label, h in records.items():
        gains = _gains(h)
        cells = [label, str(h["floor"]["weights"]["count"]), *(f"{gains[c]:.1f}" for c in cols), h["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: The record of docs/health.md's worked example: the authors' d=512 scales, measured on the CPU.
AUTHORS_D512 = DOCS / "health-authors-d512.json"


def layer_norm_gains_table() -> str:
    """The LayerNorms with the highest gains after the authors' scales: input σ and gain before and after."""
    h = health_of(AUTHORS_D512)
    by_name = {n["name"]: n for n in h["norms"]}
    lines = ["| LayerNorm | σ before | gain before | σ after | gain after |", "|---|---:|---:|---:|---:|"]
    for name in clamp_columns(h):
        n = by_name[name]
        # two significant digits after the scales: σ falls to hundredths there
        lines.append(f"| {name} | {n['input_std_before']:.2f} | {n['gain_before']:.2f} | "
                     f"{n['input_std_after']:#.2g} | {n['gain_after']:.1f} |")
    return "\n".join(lines) + "\n"


def decoder_quieting_table() -> str:
    """How many times quieter each decoder block's gradient is after the authors' scales than before."""
    h = health_of(AUTHORS_D512)
    lines = ["| block | gradient RMS before the scales / after |", "|---|---:|"]
    lines += [f"| {b['name']} | {b['quieting']:.3g} |" for b in h["blocks"] if b["name"].startswith("decoder.layers.")]
    return "\n".join(lines) + "\n"
