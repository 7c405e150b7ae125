#!/usr/bin/env python3
"""The per-layer report of a GradInit run (the ``gradinit-report`` command of the installed package, :mod:`fairseq_gradinit.tools.gradinit_report`)."""
import sys

from fairseq_gradinit.tools.gradinit_report import run

if __name__ == "__main__":
    sys.exit(run())
