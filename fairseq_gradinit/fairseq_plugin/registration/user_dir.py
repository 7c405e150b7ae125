"""Print the directory to pass as ``fairseq-train --user-dir`` (works from any directory)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence


def user_dir() -> str:
    """Absolute path of the installed ``fairseq_gradinit`` package."""
    return str(Path(__file__).resolve().parents[2])


def main(argv: Optional[Sequence[str]] = None) -> None:
    argparse.ArgumentParser(
        description="Print the path for `fairseq-train --user-dir $(gradinit-user-dir) ...`."
    ).parse_args(argv)
    print(user_dir())  # noqa: T201 - this is the command's output


if __name__ == "__main__":
    main()
