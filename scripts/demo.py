#!/usr/bin/env python3
"""The quick start's Transformer without warmup from Xavier and after GradInit, side by side (the ``gradinit-demo`` command of the installed package, :mod:`fairseq_gradinit.tools.demo`)."""
import sys

from fairseq_gradinit.tools.demo import run

if __name__ == "__main__":
    sys.exit(run())
