"""Per-seed tables of a finished study: validation loss at chosen updates, training loss, BLEU.

Reads what ``scripts/study.py`` writes into its ``--out`` folder (``curves.csv``, ``bleu.json``) and
groups arms named ``CONFIG-sN`` by configuration, so that seeds are shown one per row with their
mean under them. Pure Python: used by ``scripts/study_table.py``.
"""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

SEED_RE = re.compile(r"^(?P<config>.+)-s(?P<seed>\d+)$")


@dataclass
class ArmRow:
    """One arm's numbers; ``None`` where the arm has no value (it stopped earlier, BLEU failed)."""

    arm: str
    config: str
    seed: Optional[int]
    valid: Dict[int, Optional[float]]
    train: Optional[float]
    last_update: int
    bleu: Optional[float] = None
    bleu_note: str = ""
    signature: Optional[str] = None


@dataclass
class SeedTable:
    updates: Tuple[int, ...]
    train_at: int
    rows: List[ArmRow] = field(default_factory=list)
    bleu_update: Optional[int] = None

    def configs(self) -> Dict[str, List[ArmRow]]:
        out: Dict[str, List[ArmRow]] = {}
        for r in self.rows:
            out.setdefault(r.config, []).append(r)
        return out

    def signatures(self) -> List[str]:
        return sorted({r.signature for r in self.rows if r.signature})


def split_arm_name(name: str) -> Tuple[str, Optional[int]]:
    """``"gi98-s2"`` -> ``("gi98", 2)``; a name without a seed suffix is its own configuration."""
    m = SEED_RE.match(name)
    return (m.group("config"), int(m.group("seed"))) if m else (name, None)


def read_curves_csv(path: Path) -> Dict[str, Dict[str, Dict[int, float]]]:
    """``{arm: {column: {update: value}}}`` from a study's ``curves.csv`` (empty cells skipped)."""
    out: Dict[str, Dict[str, Dict[int, float]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            arm = out.setdefault(row["arm"], {})
            update = int(float(row["num_updates"]))
            for col, value in row.items():
                if col in ("arm", "num_updates") or value in ("", None):
                    continue
                try:
                    arm.setdefault(col, {})[update] = float(value)
                except ValueError:
                    continue
    return out


def _at_or_before(curve: Mapping[int, float], update: int) -> Optional[float]:
    """The last value logged at or before ``update`` (training loss is logged every N updates)."""
    seen = [u for u in curve if u <= update]
    return curve[max(seen)] if seen else None


def build_table(study_dir: Path, *, updates: Sequence[int], train_at: Optional[int] = None,
                arms: Optional[Sequence[str]] = None) -> SeedTable:
    """The table of the study in ``study_dir``: validation loss at each of ``updates`` (exactly that
    update, else none), training loss at ``train_at`` (default: the last of ``updates``) and BLEU."""
    study_dir = Path(study_dir)
    csv_path = study_dir / "curves.csv"
    if not csv_path.is_file():
        raise ValueError(f"{study_dir} has no curves.csv: pass the --out folder of a finished scripts/study.py run")
    if not updates or any(int(u) <= 0 for u in updates):
        raise ValueError(f"updates must be positive integers, got {list(updates)}")
    updates = tuple(sorted(int(u) for u in updates))
    curves = read_curves_csv(csv_path)
    bleu: Mapping = {}
    bleu_update = None
    if (study_dir / "bleu.json").is_file():
        loaded = json.loads((study_dir / "bleu.json").read_text(encoding="utf-8"))
        bleu, bleu_update = loaded.get("arms") or {}, loaded.get("update")
    names = list(arms) if arms else list(curves)
    unknown = [n for n in names if n not in curves]
    if unknown:
        raise ValueError(f"arms not in {csv_path}: {unknown} (it has {sorted(curves)})")
    table = SeedTable(updates=updates, train_at=int(train_at or updates[-1]), bleu_update=bleu_update)
    for name in names:
        c = curves[name]
        config, seed = split_arm_name(name)
        valid = c.get("valid_loss", {})
        logged = [u for col in c.values() for u in col]
        b = bleu.get(name) or {}
        score = b.get("bleu")
        note = "" if score is not None else (b.get("reason") or b.get("status") or ("not scored" if bleu else ""))
        table.rows.append(ArmRow(
            arm=name, config=config, seed=seed, valid={u: valid.get(u) for u in updates},
            train=_at_or_before(c.get("train_loss", {}), table.train_at), last_update=max(logged) if logged else 0,
            bleu=None if score is None else float(score), bleu_note=str(note), signature=b.get("signature")))
    return table


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    """Mean of the values, or None unless every seed has one (a mean over fewer seeds misleads)."""
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


def _fmt(v: Optional[float], digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def markdown(table: SeedTable) -> str:
    """The table as Markdown: one row per arm, and a mean row per configuration with several seeds."""
    head = (["configuration", "seed"] + [f"valid @{u}" for u in table.updates]
            + [f"train @{table.train_at}", "last update", "BLEU"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for config, rows in table.configs().items():
        for r in rows:
            bleu = _fmt(r.bleu) if r.bleu is not None else ("–" + (f" ({r.bleu_note})" if r.bleu_note else ""))
            lines.append("| " + " | ".join(
                [f"`{config}`", "–" if r.seed is None else str(r.seed)] + [_fmt(r.valid[u]) for u in table.updates]
                + [_fmt(r.train), str(r.last_update), bleu]) + " |")
        if len(rows) > 1:
            lines.append("| " + " | ".join(
                [f"`{config}`", "**mean**"] + [_fmt(_mean([r.valid[u] for r in rows])) for u in table.updates]
                + [_fmt(_mean([r.train for r in rows])), "", _fmt(_mean([r.bleu for r in rows]))]) + " |")
    notes = ["", "Validation loss: fairseq's eval-mode label-smoothed loss (base 2) at exactly that update; "
                 "– where the arm stopped earlier. Training loss: the last `train_inner` average at or before "
                 f"update {table.train_at}. A mean needs every seed's value."]
    if table.bleu_update is not None:
        notes.append(f"BLEU at update {table.bleu_update}; sacreBLEU signature: "
                     + ("; ".join(f"`{s}`" for s in table.signatures()) or "–"))
    return "\n".join(lines + notes) + "\n"


def to_json(table: SeedTable) -> dict:
    return {
        "updates": list(table.updates), "train_at": table.train_at, "bleu_update": table.bleu_update,
        "arms": {r.arm: {"config": r.config, "seed": r.seed, "valid": {str(u): v for u, v in r.valid.items()},
                         "train": r.train, "last_update": r.last_update, "bleu": r.bleu, "bleu_note": r.bleu_note,
                         "signature": r.signature} for r in table.rows},
        "means": {c: {"seeds": [r.seed for r in rows],
                      "valid": {str(u): _mean([r.valid[u] for r in rows]) for u in table.updates},
                      "train": _mean([r.train for r in rows]), "bleu": _mean([r.bleu for r in rows])}
                  for c, rows in table.configs().items() if len(rows) > 1},
    }
