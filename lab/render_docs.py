#!/usr/bin/env python3
"""Tables in the docs and the research record (lab/record/) that quote measurements, generated from the stored
records.

Each table sits between ``<!-- generated:NAME:start -->`` and ``<!-- generated:NAME:end -->`` in its page (a page
may hold several); ``python -m lab.render_docs`` rewrites them from the records, ``--check`` says which are stale
(the test suite runs the check). Prose around a table keeps its claims and points at the table. The source-use
table is rendered here, the others in :mod:`lab.docs_tables`, one module per record; :data:`TABLES` lists them all.

    python -m lab.render_docs            # rewrite the generated tables
    python -m lab.render_docs --check    # exit 1 if any is stale
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from .docs_tables.converge import headline_table
from .docs_tables.health import clamp_health_table, decoder_quieting_table, layer_norm_gains_table
from .docs_tables.hold import hold_a_table, hold_table
from .docs_tables.quickstart import threads_table, timings_table
from .docs_tables.testbed import testbed_table, two_seeds_table
from .study.tables import comparator_of, read_curves_csv, split_arm_name
from .study.verdict import judge

REPO = Path(__file__).resolve().parents[1]
SOURCE_USE = REPO / "lab" / "record" / "testbed-d128" / "source-use"


def _stored_arms(dirs: Sequence[Path]) -> Tuple[Dict[str, dict], Dict[str, dict], Dict[str, str]]:
    """``(curves, bleu, batch)`` of every arm of the stored studies in ``dirs``, by arm name (a later study's arm
    of the same name replaces an earlier one's); ``batch`` is the folder each arm came from."""
    curves: Dict[str, dict] = {}
    bleu: Dict[str, dict] = {}
    batch: Dict[str, str] = {}
    for d in dirs:
        arms = read_curves_csv(d / "curves.csv")
        curves.update(arms)
        batch.update({name: d.name for name in arms})
        if (d / "bleu.json").is_file():
            bleu.update((json.loads((d / "bleu.json").read_text(encoding="utf-8")).get("arms") or {}))
    return curves, bleu, batch


def _fmt(v, digits: int = 3) -> str:
    return "–" if v is None else f"{round(v, digits) + 0.0:.{digits}f}"  # + 0.0: no "-0.000"


def source_use_table(dirs: Sequence[Path] = (), *, comparator: str = "warmup",
                     updates: Tuple[int, ...] = (500, 1000)) -> str:
    """The CPU testbed's arms judged by source use: loss and source gap at ``updates``, BLEU and distinct
    hypotheses at the last update, and each arm's verdict against the ``comparator`` run of its seed
    (:mod:`.study.verdict`)."""
    dirs = list(dirs) or sorted(p for p in SOURCE_USE.iterdir() if (p / "curves.csv").is_file())
    curves, bleu, batch_of = _stored_arms(dirs)
    comparators = {n for n in curves if n == comparator or re.fullmatch(rf"{re.escape(comparator)}-s\d+", n)}
    head = ["arm", "batch", "seed"] + [f"loss @{u}" for u in updates] + [f"source gap @{u}" for u in updates] \
        + ["BLEU", "distinct hypotheses", "verdict against the comparator of its seed"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|" + "---:|" * (2 * len(updates) + 2) + "---|"]
    for name in sorted(curves, key=lambda n: (n not in comparators, batch_of[n], n)):
        c = curves[name]
        loss, gap = c.get("valid_loss", {}), c.get("valid_src_gap", {})
        b = bleu.get(name) or {}
        twin = comparator_of(name, comparator)
        ref_name = twin if twin in curves else comparator
        if name in comparators:
            verdict = "the comparator"
        elif ref_name not in curves:
            verdict = "–"
        else:
            v = judge(name, c, ref_name, curves[ref_name])
            verdict = "–" if v.holds is None else ("holds" if v.holds else "fails: " + "; ".join(v.reasons))
        lines.append("| " + " | ".join(
            [f"`{name}`", batch_of[name], str(split_arm_name(name)[1] or 1)] + [_fmt(loss.get(u)) for u in updates]
            + [_fmt(gap.get(u)) for u in updates]
            + [_fmt(b.get("bleu"), 2), "–" if b.get("distinct_hypotheses") is None else str(b["distinct_hypotheses"]),
               verdict]) + " |")
    return "\n".join(lines) + "\n"


DOCS, RECORD = REPO / "docs", REPO / "lab" / "record"

#: name -> (page, renderer): every generated table, in docs/ and in the research record (lab/record/); a page
#: may hold several, each between its own markers.
TABLES: Mapping[str, Tuple[Path, Callable[[], str]]] = {
    "source-use": (DOCS / "no-warmup.md", source_use_table),
    "headline": (DOCS / "no-warmup.md", headline_table),
    "testbed-d128": (DOCS / "no-warmup.md", testbed_table),
    "testbed-d128-two-seeds": (DOCS / "no-warmup.md", two_seeds_table),
    "hold-a": (RECORD / "no-warmup.md", hold_a_table),
    "hold": (RECORD / "no-warmup.md", hold_table),
    "remedies-hold-a": (DOCS / "remedies.md", hold_a_table),
    "clamp-health": (DOCS / "remedies.md", clamp_health_table),
    "health-layer-norm-gains": (DOCS / "health.md", layer_norm_gains_table),
    "health-decoder-quieting": (DOCS / "health.md", decoder_quieting_table),
    "quickstart-timings": (DOCS / "fairseq.md", timings_table),
    "threads": (DOCS / "fairseq.md", threads_table),
}


def _span(name: str) -> "re.Pattern[str]":
    return re.compile(rf"(<!-- generated:{re.escape(name)}:start -->\n)(.*?)(<!-- generated:{re.escape(name)}:end -->)",
                      re.S)


def render(check: bool = False) -> List[str]:
    """Rewrite (or with ``check`` only compare) every table; the names of the stale ones."""
    stale = []
    pages: Dict[Path, List[str]] = {}
    for name, (page, _) in TABLES.items():
        pages.setdefault(page, []).append(name)
    for page, names in pages.items():
        text = page.read_text(encoding="utf-8")
        new = text
        for name in names:
            m = _span(name).search(new)
            if m is None:
                raise ValueError(f"{page} has no <!-- generated:{name}:start/end --> markers; "
                                 "add them where the table goes")
            fresh = TABLES[name][1]()
            if m.group(2) != fresh:
                stale.append(name)
                new = new[:m.start(2)] + fresh + new[m.end(2):]
        if new != text and not check:
            page.write_text(new, encoding="utf-8")
    return stale


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.render_docs", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only say which tables are stale (exit 1 if any)")
    args = p.parse_args(argv)
    stale = render(check=args.check)
    for name in stale:
        print(f"{'stale' if args.check else 'rewrote'}: {name} ({TABLES[name][0].relative_to(REPO)})")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
