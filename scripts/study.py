#!/usr/bin/env python3
"""The study runner: named fairseq-train arms within a wall-time budget (the ``gradinit-study`` command of the installed package, :mod:`fairseq_gradinit.study.cli`)."""
import sys

from fairseq_gradinit.study.cli import run

if __name__ == "__main__":
    sys.exit(run())
