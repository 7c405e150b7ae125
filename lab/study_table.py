#!/usr/bin/env python3
"""Per-seed table of a finished study (``python -m lab.study --out DIR``): validation loss at chosen
updates, training loss, BLEU with its sacreBLEU signature, and the mean over seeds of arms named
``CONFIG-sN``. Writes Markdown (stdout or ``--md``) and JSON (``--json``).

    python -m lab.study_table runs/confirm-A --updates 500,1000,2000,3000 --md table.md --json table.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fairseq_gradinit.files.paths import check_output, header_line, json_result, text_output, write_json

from .study.tables import build_table, markdown, to_json

COMMAND = "python -m lab.study_table"


def _updates(text: str):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated update numbers, e.g. 500,1000, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive update numbers, got {text!r}")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.study_table", description=__doc__.split("\n\n")[0])
    p.add_argument("study_dir", type=Path, help="the --out folder of python -m lab.study")
    p.add_argument("--updates", type=_updates, default=[500, 1000, 2000, 3000],
                   help="validation updates to show (default: 500,1000,2000,3000)")
    p.add_argument("--train-at", type=int, help="update of the training-loss column (default: the last of --updates)")
    p.add_argument("--arms", help="comma-separated arms, in this order (default: all, in curves.csv order)")
    p.add_argument("--comparator", help="judge every other arm against this arm (its twin of the same seed, "
                   "CONFIG-sN): source gap from update 500 on, and BLEU with --bleu-decides (lab/study/verdict.py)")
    p.add_argument("--bleu-decides", action="store_true", help="with --comparator: BLEU decides too (at convergence)")
    p.add_argument("--md", type=Path, help="write the Markdown table here (default: print it)")
    p.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    args = p.parse_args(argv)
    inputs = {"study_dir": [args.study_dir / n for n in ("curves.csv", "study.json", "bleu.json")]}
    try:
        if args.md:
            check_output("--md", args.md, text_output("a table of python -m lab.study_table", COMMAND, markdown=True),
                         inputs=inputs)
        if args.json:
            check_output("--json", args.json, json_result("a table of gradinit-study-table", "updates", "train_at",
                                                          command=COMMAND), inputs=inputs)
        table = build_table(args.study_dir, updates=args.updates, train_at=args.train_at,
                            arms=args.arms.split(",") if args.arms else None, comparator=args.comparator,
                            bleu_decides=args.bleu_decides)
    except (ValueError, OSError) as e:
        print(f"study_table: error: {e}", file=sys.stderr)
        return 2
    text = markdown(table)
    if args.md:
        args.md.write_text(header_line(COMMAND, markdown=True) + "\n" + text, encoding="utf-8")
    else:
        print(text, end="")
    if args.json:
        write_json(args.json, to_json(table), command=COMMAND)
    return 0


if __name__ == "__main__":
    sys.exit(main())
