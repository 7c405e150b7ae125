#!/usr/bin/env python3
"""A checkpoint's validation loss in eval and train mode (the ``gradinit-valid-loss-modes`` command of the installed package, :mod:`fairseq_gradinit.tools.valid_loss_modes`)."""
import sys

from fairseq_gradinit.tools.valid_loss_modes import run

if __name__ == "__main__":
    sys.exit(run())
