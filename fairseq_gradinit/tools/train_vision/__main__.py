"""``python -m fairseq_gradinit.tools.train_vision``: the ``gradinit-train-vision`` command."""
import sys

from .cli import run

if __name__ == "__main__":
    sys.exit(run())
