#!/usr/bin/env python3
"""Moved: the study runner is the research lab's ``python -m lab.study`` (this prints where it went)."""
import sys

from fairseq_gradinit.moved import study

if __name__ == "__main__":
    sys.exit(study())
