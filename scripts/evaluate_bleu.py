#!/usr/bin/env python3
"""Translate a binarized split with fairseq-generate and score it with sacreBLEU (the ``gradinit-evaluate-bleu`` command of the installed package, :mod:`fairseq_gradinit.tools.evaluate_bleu`)."""
import sys

from fairseq_gradinit.tools.evaluate_bleu import run

if __name__ == "__main__":
    sys.exit(run())
