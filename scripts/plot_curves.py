#!/usr/bin/env python3
"""Training curves of fairseq-train logs (the ``gradinit-plot-curves`` command of the installed package, :mod:`fairseq_gradinit.tools.plot_curves`)."""
import sys

from fairseq_gradinit.tools.plot_curves import run

if __name__ == "__main__":
    sys.exit(run())
