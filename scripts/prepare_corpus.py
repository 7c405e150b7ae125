#!/usr/bin/env python3
"""A raw parallel corpus to SentencePiece pieces and a fairseq data-bin (the ``gradinit-prepare-corpus`` command of the installed package, :mod:`fairseq_gradinit.tools.prepare_corpus`)."""
import sys

from fairseq_gradinit.tools.prepare_corpus import run

if __name__ == "__main__":
    sys.exit(run())
