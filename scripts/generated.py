"""Blocks of the docs generated from the code or from result files: one ``--write``/``--check`` loop
for the developer scripts that keep them (``scripts/options_table.py``, ``scripts/benchmark_tables.py``)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence


def update_generated(repo: Path, files: Sequence[str], render: Callable[[str], str], *, write: bool,
                     tool: str) -> int:
    """Render every file of ``files`` (relative to ``repo``); with ``write`` rewrite the stale ones,
    else exit status 1 naming them. A ``ValueError`` of ``render`` is one line and status 1."""
    stale = []
    try:
        for rel in files:
            path = repo / rel
            old = path.read_text(encoding="utf-8")
            new = render(old)
            if new != old:
                stale.append(rel)
                if write:
                    path.write_text(new, encoding="utf-8")
    except ValueError as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return 1
    if write:
        print(f"updated: {', '.join(stale) or 'nothing (up to date)'}")
        return 0
    if stale:
        print(f"{tool}: out of date: {', '.join(stale)}; run python scripts/{tool}.py --write", file=sys.stderr)
        return 1
    return 0
