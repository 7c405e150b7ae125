"""Known third-party deprecation noise, hidden in this package's entry points (the fairseq plugin when it
is loaded, the scripts). Only the warnings listed here are hidden, nothing of fairseq's logging; set
``FAIRSEQ_GRADINIT_WARNINGS=all`` (or pass ``-W``/``PYTHONWARNINGS`` yourself) to see them all."""
from __future__ import annotations

import os
import sys
import warnings
from typing import Callable, Optional

#: The warning filter fairseq's data iterators put into PYTHONWARNINGS for their worker processes.
FAIRSEQ_WORKER_FILTER = "ignore:semaphore_tracker:UserWarning"
#: The variable that, set to ``all``, keeps every warning.
SHOW_ALL_ENV = "FAIRSEQ_GRADINIT_WARNINGS"

#: Start (a regular expression, matched as :func:`warnings.filterwarnings` does) of each hidden message:
#: deprecations inside hydra, torch and fairseq that a user of this package can do nothing about.
KNOWN_NOISE = (
    # hydra, when fairseq builds its configuration
    r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'",
    r"\s*'config' is validated against ConfigStore schema with the same name",
    r"\s*The strict flag in the compose API is deprecated",
    # torch, on fairseq's calls
    r"`torch\.jit\.script` is deprecated",
    r"`torch\.cuda\.amp\.(autocast|GradScaler)\(args\.\.\.\)` is deprecated",
    r"Support for mismatched key_padding_mask and attn_mask is deprecated",
    r"'pin_memory' argument is set as true but no accelerator is found",
)


def hide_known_noise() -> bool:
    """Hide the warnings of :data:`KNOWN_NOISE` in this process, unless ``FAIRSEQ_GRADINIT_WARNINGS=all``
    or the user set warning filters (``-W``, ``PYTHONWARNINGS``). Returns whether they are hidden."""
    # fairseq's data iterators set PYTHONWARNINGS to this for their worker processes: not the user's choice.
    user_options = [o for o in sys.warnoptions if o != FAIRSEQ_WORKER_FILTER]
    if os.environ.get(SHOW_ALL_ENV, "").strip().lower() == "all" or user_options:
        return False
    for message in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message)
    return True


def quiet_command(main: Callable[[], Optional[int]], name: str) -> Callable[[], int]:
    """The console-script function ``name`` of a tool: ``main()`` with :data:`KNOWN_NOISE` hidden."""

    def run() -> int:
        hide_known_noise()
        return main() or 0

    run.__name__ = "run"
    run.__doc__ = f"The ``{name}`` command: ``{main.__name__}()`` with known third-party warnings hidden."
    return run
