"""Reading the stored records the tables quote: curves, training logs, monitor records, study files."""
from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from ..study.tables import read_curves_csv

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "lab" / "record"
EVIDENCE = RECORD / "evidence"
TESTBED = RECORD / "testbed-d128"

#: The monitor's warning that a run's eval-mode loss on its fixed batch left its train-mode loss.
GAP_WARNING = "monitor: eval - train loss"


@lru_cache(maxsize=None)
def curves(folder: Path) -> Dict[str, Dict[str, Dict[int, float]]]:
    """``{arm: {column: {update: value}}}`` of ``folder/curves.csv`` (read once per process: several tables
    quote the same study)."""
    return read_curves_csv(folder / "curves.csv")


def _open_log(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


@lru_cache(maxsize=None)
def gap_warnings(folder: Path, arm: str) -> int:
    """How many gap warnings the monitor wrote to ``arm``'s training log in the study ``folder``."""
    log = folder / "arms" / arm / "train.log.gz"
    with _open_log(log if log.is_file() else log.with_suffix("")) as f:
        return sum(GAP_WARNING in line for line in f)


@lru_cache(maxsize=None)
def monitor(folder: Path, arm: str) -> List[dict]:
    """The records of ``arm``'s ``monitor.jsonl.gz`` in the study ``folder``."""
    with gzip.open(folder / "arms" / arm / "monitor.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def study(folder: Path, name: str = "study.json") -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def as_stored(v: Optional[float]) -> str:
    """A loss as ``curves.csv`` stores it (fairseq's three decimals, trailing zeros dropped)."""
    return "–" if v is None else repr(v)
