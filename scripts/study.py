#!/usr/bin/env python3
"""Run a study: named fairseq-train arms on one data-bin, within a wall-time budget, on one GPU
(arms at once, --parallel N) or the CPU (--cpu, one at a time). GradInit scales are computed once
per configuration and re-applied (--gradinit-init-file) in every arm that shares it; per-arm
curves (CSV, PNG, Markdown) and BLEU at the largest common checkpoint are written in the same run.

    python scripts/study.py --list-presets
    python scripts/study.py data-bin/debian-ui-de-en/bin --preset demo --cpu --out runs/demo
    python scripts/study.py DATA --out runs/x --arm 'a=--lr 1e-3 ...' --arm 'b=...' --dry-run

The logic is the package fairseq_gradinit/study/ (presets: presets.py); see
docs/no-warmup.md for the GPU studies.
"""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fairseq_gradinit.study.cli import main  # noqa: E402

if __name__ == "__main__":
    from fairseq_gradinit.quiet import hide_known_noise

    hide_known_noise()
    sys.exit(main(bleu_script=REPO / "scripts" / "evaluate_bleu.py"))
