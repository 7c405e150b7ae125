#!/usr/bin/env python3
"""Per-layer GradInit report: scales, weight norms and gradient spread before/after, as JSON and PNG.

    python scripts/gradinit_report.py --gradinit-json runs/g98/gradinit.json --out report/g98 \\
        --batches 8 [--mode train|eval] -- \\
        data-bin/debian-ui-de-en/bin --arch transformer_iwslt_de_en --share-all-embeddings \\
        --dropout 0.3 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \\
        --max-tokens 1024 --seed 1 --cpu

Everything after ``--`` is a fairseq-train command line (the model and data GradInit ran on; the same
``--seed`` rebuilds the same initial weights; ``--max-tokens`` sets the minibatch size of the report;
``--gradinit-*`` options are ignored). Writes OUT.json (per tensor: place, scale, ||W|| and mean |W|,
gradient std before/after; per group summaries; a check that GradInit's first recorded iteration is
reproduced; the ``health`` block that the plugin stores in gradinit.json, see docs/health.md) and
OUT.png (needs matplotlib: ``pip install matplotlib``, the ``[plot]`` extra). ``--health-only`` writes
the ``health`` block alone, e.g. for a gradinit.json written before the plugin stored it.
Definitions and the choice of train mode: ``fairseq_gradinit/core/norms_and_spread.py``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional, Sequence, Tuple

from ..command_line.argtypes import int_at_least
from ..command_line.quiet import quiet_command
from ..files.paths import OutputError, check_output, json_result, png_output, write_json

COMMAND = "gradinit-report"

logger = logging.getLogger("gradinit_report")


def split_argv(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    argv = list(argv)
    if "--" not in argv and ("-h" in argv or "--help" in argv):
        return argv, []  # the parser prints the help and exits 0
    if "--" not in argv:
        raise SystemExit(f"{COMMAND}: error: put the fairseq-train arguments after '--', e.g. "
                         f"{COMMAND} --gradinit-json G --out O -- DATA --arch transformer_iwslt_de_en ...")
    i = argv.index("--")
    return argv[:i], argv[i + 1:]




#: What ``--help`` says after the options: the fairseq-train command line that follows ``--``.
AFTER_DASHES = """after --: the fairseq-train command line of the run (its data-bin, --arch, the model's options,
--seed, --max-tokens ...), e.g.
  gradinit-report --gradinit-json runs/g/gradinit.json --out report/g -- \\
      data-bin/debian-ui-de-en/bin --arch transformer_iwslt_de_en --share-all-embeddings --seed 1 --cpu
The same --seed rebuilds the same initial weights, --max-tokens sets the report's minibatch size, and
--gradinit-* options are ignored."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The epilog as written; an option's default appended where its help does not already state it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=_HelpFormatter, epilog=AFTER_DASHES)
    p.add_argument("--gradinit-json", required=True, help="gradinit.json with the learned scales")
    p.add_argument("--out", required=True, help="output prefix: writes OUT.json and OUT.png")
    p.add_argument("--batches", type=int_at_least(2), default=8, help="k, minibatches the gradient std is taken over")
    p.add_argument("--mode", choices=["train", "eval"], default="train",
                   help="gradients with dropout on (train, what the optimizer sees) or off (eval, as GradInit)")
    p.add_argument("--batch-seed", type=int, default=None,
                   help="seed of the minibatch draw and of the dropout masks (default: the fairseq --seed)")
    p.add_argument("--no-check", action="store_true",
                   help="skip recomputing GradInit's first iteration from the rebuilt model")
    p.add_argument("--title", default=None, help="figure title (default: the gradinit.json path)")
    p.add_argument("--no-health", action="store_true",
                   help="skip the health check (tensors at their lower bound, LayerNorm gains before/after)")
    p.add_argument("--health-only", action="store_true",
                   help="only the health check: OUT.json holds the 'health' block as gradinit.json stores it "
                        "(measured on GradInit's last S batch), no per-tensor report and no OUT.png")
    # argparse's own usage, with the part after `--` that it cannot know about
    p.usage = p.format_usage().split(" ", 1)[1].rstrip() + " -- DATA [fairseq-train options ...]"
    return p


def check_report_outputs(args, train_argv: Sequence[str]) -> None:
    """OUT.json and OUT.png are neither the ``--gradinit-json`` nor a file of the fairseq-train command line."""
    inputs = {"--gradinit-json": args.gradinit_json,
              "(fairseq-train argument)": [a for a in train_argv if not a.startswith("-") and os.path.exists(a)]}
    check_output("--out", args.out + ".json", json_result("a report of gradinit-report", "meta", command=COMMAND),
                 inputs=inputs)
    if not args.health_only:
        check_output("--out", args.out + ".png", png_output(COMMAND), inputs=inputs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, train_argv = split_argv(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.health_only and args.no_health:
        parser.error("--health-only and --no-health exclude each other")
    try:
        check_report_outputs(args, train_argv)
    except OutputError as e:
        parser.error(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    if args.batches < 2:
        logger.error("--batches must be at least 2 (a standard deviation needs two minibatches)")
        return 1
    from fairseq_gradinit.fairseq_plugin.analysis import per_layer as rep

    try:
        result = rep.run_report(train_argv, args.gradinit_json, num_batches=args.batches, mode=args.mode,
                                seed=args.batch_seed, check=not args.no_check, health=not args.no_health,
                                health_only=args.health_only)
    except (ValueError, OSError) as e:  # bad values; a --gradinit-json that is missing, a folder, unreadable
        logger.error("%s", e)
        return 1
    out_json, out_png = args.out + ".json", args.out + ".png"
    write_json(out_json, result, command=COMMAND)
    logger.info("wrote %s", out_json)
    check = result.get("check_first_iteration", {})
    if check.get("done") and not check.get("consistent"):
        logger.warning("GradInit's first iteration is NOT reproduced (loss %.6g vs recorded %.6g): the rebuilt "
                       "model or data differ from the run that wrote %s", check["loss_s"], check["recorded_loss_s"],
                       args.gradinit_json)
    if args.health_only:
        return 0
    try:
        rep.plot_report(result["tensors"], out_png, title=args.title or args.gradinit_json, command=COMMAND)
    except ImportError:
        print(f"error: matplotlib is not installed, so {out_png} was not written (the JSON was); "
              "install it with `pip install matplotlib` (or the package's [plot] extra)", file=sys.stderr)
        return 2
    logger.info("wrote %s", out_png)
    return 0


run = quiet_command(main, COMMAND)


if __name__ == "__main__":
    sys.exit(run())
