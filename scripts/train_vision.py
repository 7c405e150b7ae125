#!/usr/bin/env python3
"""Train an image classifier with GradInit, MetaInit or the paper's baselines (the ``gradinit-train-vision`` command of the installed package, :mod:`fairseq_gradinit.tools.train_vision.cli`)."""
import sys

from fairseq_gradinit.tools.train_vision.cli import run

if __name__ == "__main__":
    sys.exit(run())
