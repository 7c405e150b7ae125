"""The exceptions of ``gradinit-train-vision``: each ends the command with one ``error:`` line."""
from __future__ import annotations


class UsageError(ValueError):
    """A bad argument: one ``error:`` line, exit status 2."""


class RunFailure(RuntimeError):
    """A failure that is not a bad argument (unreadable file, diverged initialization): exit status 1."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during training, after the state of the output folder was logged."""
