#!/usr/bin/env python3
"""GradInit against Kaiming's initialization for a short budget, with a plot (the ``gradinit-compare-vision`` command of the installed package, :mod:`fairseq_gradinit.tools.compare_vision`)."""
import sys

from fairseq_gradinit.tools.compare_vision import run

if __name__ == "__main__":
    sys.exit(run())
