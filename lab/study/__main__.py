"""``python -m lab.study gradinit-phase ARGS`` (a study's GradInit phase) or the study CLI."""
import logging
import sys

from .cli import run
from .plan import gradinit_phase_main

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "gradinit-phase":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                            stream=sys.stdout)
        sys.exit(gradinit_phase_main(sys.argv[2:]))
    sys.exit(run())
