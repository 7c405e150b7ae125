#!/usr/bin/env python3
"""The per-seed table of a finished study (the ``gradinit-study-table`` command of the installed package, :mod:`fairseq_gradinit.tools.study_table`)."""
import sys

from fairseq_gradinit.tools.study_table import main

if __name__ == "__main__":
    sys.exit(main())
