"""Per-seed tables of a finished study: validation loss at chosen updates, training loss, BLEU.

Reads what ``python -m lab.study`` writes into its ``--out`` folder (``curves.csv``, ``bleu.json``) and
groups arms named ``CONFIG-sN`` by configuration, so that seeds are shown one per row with their
mean under them. Pure Python: used by ``python -m lab.study_table``.
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
    #: The source gap (rolled minus plain validation loss, bits) at each update; empty without it.
    src_gap: Dict[int, Optional[float]] = field(default_factory=dict)
    distinct: Optional[int] = None
    #: The verdict against the comparator (:mod:`.verdict`): "holds", "fails: ...", or "" (not judged).
    verdict: str = ""


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
    """``{arm: {column: {update: value}}}`` from a study's ``curves.csv`` (empty cells skipped).

    A file that is not whole is refused with a ``ValueError`` naming it and the line: no header, a
    row with too few or too many fields (a truncated write), a value that is not a number, an
    update logged twice for one arm.
    """
    out: Dict[str, Dict[str, Dict[int, float]]] = {}
    seen: Dict[Tuple[str, int], int] = {}
    advice = "rewrite it with python -m lab.study (or restore it from the study's export)"
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header:
            raise ValueError(f"{path} is empty (no header line): it is not a whole curves.csv; {advice}")
        if "arm" not in header or "num_updates" not in header:
            raise ValueError(f"{path}, line 1: the header {header[:4]} lacks the columns 'arm' and 'num_updates'; "
                             f"it is not a curves.csv of python -m lab.study")
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise ValueError(f"{path}, line {line}: {len(fields)} fields where the header has {len(header)} "
                                 f"(a truncated or damaged row); {advice}")
            row = dict(zip(header, fields))
            name = row["arm"].strip()
            if not name:
                raise ValueError(f"{path}, line {line}: no arm name; {advice}")
            try:
                update = float(row["num_updates"])
                if not update.is_integer() or update < 0:
                    raise ValueError
                update = int(update)
            except ValueError:
                raise ValueError(f"{path}, line {line}: num_updates {row['num_updates']!r} is not an update number; "
                                 f"{advice}") from None
            if (name, update) in seen:
                raise ValueError(f"{path}, line {line}: arm {name!r} at update {update} again (first at line "
                                 f"{seen[name, update]}); {advice}")
            seen[name, update] = line
            arm = out.setdefault(name, {})
            for col, value in row.items():
                if col in ("arm", "num_updates") or value == "":
                    continue
                try:
                    arm.setdefault(col, {})[update] = float(value)
                except ValueError:
                    raise ValueError(f"{path}, line {line}: {col} {value!r} is not a number; {advice}") from None
    return out


def check_against_study_json(curves: Mapping[str, Mapping[str, Mapping[int, float]]], csv_path: Path,
                             study_json: Path) -> None:
    """Refuse a ``curves.csv`` that lacks an arm, or an arm's last updates, that ``study.json`` of
    the same study recorded (a partial copy or an interrupted rewrite)."""
    try:
        arms = json.loads(study_json.read_text(encoding="utf-8"))["arms"]
        recorded = {name: int(a.get("last_update") or 0) for name, a in arms.items() if a.get("trained")}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{study_json} is not a study.json of python -m lab.study ({type(e).__name__}: {e})") from None
    for name, last in recorded.items():
        logged = [u for col in curves.get(name, {}).values() for u in col]
        if last > 0 and not logged:
            raise ValueError(f"{csv_path} has no rows of arm {name!r}, which {study_json} says reached update "
                             f"{last}: the file is incomplete; rewrite it with python -m lab.study")
        if logged and max(logged) < last:
            raise ValueError(f"{csv_path} ends arm {name!r} at update {max(logged)}, but {study_json} says it reached "
                             f"update {last}: the file is incomplete; rewrite it with python -m lab.study")


def _at_or_before(curve: Mapping[int, float], update: int) -> Optional[float]:
    """The last value logged at or before ``update`` (training loss is logged every N updates)."""
    seen = [u for u in curve if u <= update]
    return curve[max(seen)] if seen else None


def comparator_of(name: str, comparator: str) -> str:
    """The comparator arm of the same seed: ``gi-s2`` -> ``warmup-s2``, ``gi`` -> ``warmup``."""
    _, seed = split_arm_name(name)
    return comparator if seed is None else f"{comparator}-s{seed}"


def build_table(study_dir: Path, *, updates: Sequence[int], train_at: Optional[int] = None,
                arms: Optional[Sequence[str]] = None, comparator: Optional[str] = None,
                bleu_decides: bool = False) -> SeedTable:
    """The table of the study in ``study_dir``: validation loss and source gap at each of ``updates``
    (exactly that update, else none), training loss at ``train_at`` (default: the last of ``updates``), BLEU
    and distinct hypotheses, and with ``comparator`` each other arm's verdict against the comparator of its
    seed (:func:`.verdict.judge`; ``bleu_decides`` at convergence)."""
    from .verdict import judge

    study_dir = Path(study_dir)
    csv_path = study_dir / "curves.csv"
    if not csv_path.is_file():
        raise ValueError(f"{study_dir} has no curves.csv: pass the --out folder of a finished python -m lab.study run")
    if not updates or any(int(u) <= 0 for u in updates):
        raise ValueError(f"updates must be positive integers, got {list(updates)}")
    updates = tuple(sorted(int(u) for u in updates))
    curves = read_curves_csv(csv_path)
    if (study_dir / "study.json").is_file():
        check_against_study_json(curves, csv_path, study_dir / "study.json")
    bleu: Mapping = {}
    bleu_update = None
    if (study_dir / "bleu.json").is_file():
        try:
            loaded = json.loads((study_dir / "bleu.json").read_text(encoding="utf-8"))
            bleu, bleu_update = loaded.get("arms") or {}, loaded.get("update")
            if not isinstance(bleu, dict):
                raise ValueError(f"'arms' is a {type(bleu).__name__}, not an object")
        except (ValueError, AttributeError) as e:
            raise ValueError(f"{study_dir / 'bleu.json'} is not a bleu.json of python -m lab.study ({e}); rewrite it "
                             "with python -m lab.study, or remove it for a table without BLEU") from None
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
        gap = c.get("valid_src_gap", {})
        verdict = ""
        other = comparator_of(name, comparator) if comparator else None
        if other is not None and other != name and other in curves:
            ref = bleu.get(other) or {}
            v = judge(name, c, other, curves[other], bleu=score, comparator_bleu=ref.get("bleu"),
                      bleu_decides=bleu_decides)
            verdict = "–" if v.holds is None else ("holds" if v.holds else "fails: " + "; ".join(v.reasons))
        table.rows.append(ArmRow(
            arm=name, config=config, seed=seed, valid={u: valid.get(u) for u in updates},
            train=_at_or_before(c.get("train_loss", {}), table.train_at), last_update=max(logged) if logged else 0,
            bleu=None if score is None else float(score), bleu_note=str(note), signature=b.get("signature"),
            src_gap={u: gap.get(u) for u in updates} if gap else {}, distinct=b.get("distinct_hypotheses"),
            verdict=verdict))
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
    gaps = any(r.src_gap for r in table.rows)
    verdicts = any(r.verdict for r in table.rows)
    head = (["configuration", "seed"] + [f"valid @{u}" for u in table.updates]
            + ([f"src gap @{u}" for u in table.updates] if gaps else [])
            + [f"train @{table.train_at}", "last update", "BLEU", "distinct hyps"] + (["verdict"] if verdicts else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2 - verdicts)
             + "---|" * verdicts]
    for config, rows in table.configs().items():
        for r in rows:
            bleu = _fmt(r.bleu) if r.bleu is not None else ("–" + (f" ({r.bleu_note})" if r.bleu_note else ""))
            lines.append("| " + " | ".join(
                [f"`{config}`", "–" if r.seed is None else str(r.seed)] + [_fmt(r.valid[u]) for u in table.updates]
                + ([_fmt(r.src_gap.get(u)) for u in table.updates] if gaps else [])
                + [_fmt(r.train), str(r.last_update), bleu, "–" if r.distinct is None else str(r.distinct)]
                + ([r.verdict or "–"] if verdicts else [])) + " |")
        if len(rows) > 1:
            lines.append("| " + " | ".join(
                [f"`{config}`", "**mean**"] + [_fmt(_mean([r.valid[u] for r in rows])) for u in table.updates]
                + ([_fmt(_mean([r.src_gap.get(u) for r in rows])) for u in table.updates] if gaps else [])
                + [_fmt(_mean([r.train for r in rows])), "", _fmt(_mean([r.bleu for r in rows])), ""]
                + ([""] if verdicts else [])) + " |")
    notes = ["", "Validation loss: fairseq's eval-mode label-smoothed loss (base 2) at exactly that update; "
                 "– where the arm stopped earlier. Training loss: the last `train_inner` average at or before "
                 f"update {table.train_at}. A mean needs every seed's value."]
    if gaps:
        notes.append("Source gap: the validation loss with the sources rolled across the batch minus the loss (bits); "
                     "about 0 for a model that ignores its source.")
    if verdicts:
        notes.append("Verdict: against the comparator of the same seed; an arm holds if its source gap is never more "
                     "than 0.5 bits below the comparator's from update 500 on (and, where BLEU decides, its BLEU is at "
                     "or above the comparator's).")
    if table.bleu_update is not None:
        notes.append(f"BLEU at update {table.bleu_update}; sacreBLEU signature: "
                     + ("; ".join(f"`{s}`" for s in table.signatures()) or "–"))
    return "\n".join(lines + notes) + "\n"


def to_json(table: SeedTable) -> dict:
    return {
        "updates": list(table.updates), "train_at": table.train_at, "bleu_update": table.bleu_update,
        "arms": {r.arm: {"config": r.config, "seed": r.seed, "valid": {str(u): v for u, v in r.valid.items()},
                         "train": r.train, "last_update": r.last_update, "bleu": r.bleu, "bleu_note": r.bleu_note,
                         "signature": r.signature, "src_gap": {str(u): v for u, v in r.src_gap.items()},
                         "distinct_hypotheses": r.distinct, "verdict": r.verdict} for r in table.rows},
        "means": {c: {"seeds": [r.seed for r in rows],
                      "valid": {str(u): _mean([r.valid[u] for r in rows]) for u in table.updates},
                      "train": _mean([r.train for r in rows]), "bleu": _mean([r.bleu for r in rows])}
                  for c, rows in table.configs().items() if len(rows) > 1},
    }
