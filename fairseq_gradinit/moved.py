"""Commands that left the installed package for the research lab of the source checkout: each prints
where it went, in one line, and exits with status 2."""
from __future__ import annotations

import sys

from .quiet import quiet_command

#: {old command: what to run instead, from the root of a checkout of the repository}.
MOVED = {
    "gradinit-study": "python -m lab.study",
    "gradinit-study-table": "python -m lab.study_table",
}


def _moved(command: str) -> int:
    print(f"{command} moved out of the installed package into the research lab of the repository: from the root "
          f"of a checkout, run `{MOVED[command]} ARGS` (see lab/README.md)", file=sys.stderr)
    return 2


#: ``gradinit-study``: now ``python -m lab.study``.
study = quiet_command(lambda: _moved("gradinit-study"), "gradinit-study")
#: ``gradinit-study-table``: now ``python -m lab.study_table``.
study_table = quiet_command(lambda: _moved("gradinit-study-table"), "gradinit-study-table")
