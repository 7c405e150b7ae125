#!/usr/bin/env python3
"""Moved: the per-seed table of a study is the research lab's ``python -m lab.study_table`` (this prints where it
went)."""
import sys

from fairseq_gradinit.moved import study_table

if __name__ == "__main__":
    sys.exit(study_table())
