"""Print the directory to pass as ``fairseq-train --user-dir`` (works from any directory).

The command imports neither fairseq nor the plugin, so its output (and its ``--help``) is that one line."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..command_line.quiet import quiet_command


def user_dir() -> str:
    """Absolute path of the installed ``fairseq_gradinit`` package."""
    return str(Path(__file__).resolve().parents[1])


def main(argv: Optional[Sequence[str]] = None) -> None:
    argparse.ArgumentParser(
        prog="gradinit-user-dir",
        description="Print the path for `fairseq-train --user-dir \"$(gradinit-user-dir)\" ...`.",
    ).parse_args(argv)
    print(user_dir())  # noqa: T201 - this is the command's output


#: The ``gradinit-user-dir`` command.
run = quiet_command(main, "gradinit-user-dir")


if __name__ == "__main__":
    sys.exit(run())
