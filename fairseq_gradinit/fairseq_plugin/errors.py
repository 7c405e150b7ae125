"""What the plugin refuses, and the one place a refusal ends ``fairseq-train``.

Every check of the plugin (:mod:`.settings.validation`) and every stop of the phase raises :class:`GradInitError`
with a message that says what to do. The task's entry points that fairseq calls
(:class:`~.registration.hook.GradInitTaskMixin`: building the model and the criterion, loading a checkpoint's task
state) run inside :func:`one_line_exit`, which turns the error into :class:`GradInitStop`: one
``gradinit: error: ...`` line on stderr and exit status 1, never a traceback. At parse time the same
messages go through the parser's own ``error:`` line instead (:func:`~.settings.validation.check_when_parsed`).
"""
from __future__ import annotations

import contextlib


class GradInitError(ValueError):
    """A setting, file or state the plugin refuses; the message says what to do."""


class GradInitStop(SystemExit):
    """Ends ``fairseq-train`` with one message on stderr and no traceback (exit status 1)."""

    def __init__(self, message: str):
        self.message = message  # the refusal, for a front end that words it as its own error
        super().__init__(f"gradinit: error: {message}")


@contextlib.contextmanager
def one_line_exit():
    """Turn a :class:`GradInitError` raised inside into :class:`GradInitStop` (the one boundary between
    the plugin's errors and fairseq-train's exit). A context, not a decorator: fairseq reads the
    signature of the task's ``build_model`` (whether it names ``from_checkpoint``), which a wrapper
    would hide."""
    try:
        yield
    except GradInitError as e:
        raise GradInitStop(str(e)) from None
