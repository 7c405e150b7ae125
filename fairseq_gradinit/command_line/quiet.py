"""Known third-party noise, kept out of this package's entry points (the fairseq plugin when it is loaded,
the scripts): the deprecation warnings listed here (``FAIRSEQ_GRADINIT_WARNINGS=all``, or your own
``-W``/``PYTHONWARNINGS``, shows them), and fairseq's printouts of its whole configuration, of the model and
its hint about tensorboardX, which go to the debug level (``FAIRSEQ_GRADINIT_LOG_LEVEL=debug`` shows them).
fairseq's other log lines are unchanged."""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Callable, Optional

#: The warning filter fairseq's data iterators put into PYTHONWARNINGS for their worker processes.
FAIRSEQ_WORKER_FILTER = "ignore:semaphore_tracker:UserWarning"
#: The variable that, set to ``all``, keeps every warning.
SHOW_ALL_ENV = "FAIRSEQ_GRADINIT_WARNINGS"

#: Start (a regular expression, matched as :func:`warnings.filterwarnings` does) of each hidden message:
#: deprecations inside hydra, torch, numpy and fairseq that a user of this package can do nothing about.
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
    # numpy 2, when fairseq's datasets hand np.array objects whose __array__ predates its copy keyword
    r"__array__ implementation doesn't accept a copy keyword",
)


#: Set to ``debug`` to see the printouts and tables that the plugin and fairseq's commands log at the debug level.
LOG_LEVEL_ENV = "FAIRSEQ_GRADINIT_LOG_LEVEL"
#: The fairseq loggers whose printouts go to the debug level: the commands' configuration (a Namespace or a
#: DictConfig, thousands of characters on one line) and model, and the tensorboardX hint of a task module.
PRINTOUT_LOGGERS = ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.preprocess", "fairseq_cli.validate",
                    "fairseq_cli.interactive", "fairseq.tasks.text_to_speech")
#: Start of the messages of those loggers that go to the debug level whatever their type.
DEBUG_HINTS = ("Please install tensorboardX",)


def is_printout(msg) -> bool:
    """A whole configuration (argparse Namespace, omegaconf DictConfig) or a model (anything with parameters)."""
    return type(msg).__name__ in ("Namespace", "DictConfig") or callable(getattr(msg, "named_parameters", None))


class DebugOnly(logging.Filter):
    """Passes a printout (:func:`is_printout`) or a hint of :data:`DEBUG_HINTS` only when its logger logs at
    DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if is_printout(record.msg) or (isinstance(record.msg, str) and record.msg.startswith(DEBUG_HINTS)):
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_printouts(names=PRINTOUT_LOGGERS) -> None:
    """Move the printouts of the loggers ``names`` to the debug level (:class:`DebugOnly`); with
    ``FAIRSEQ_GRADINIT_LOG_LEVEL=debug`` they and this package's loggers log at debug. Idempotent."""
    debug = os.environ.get(LOG_LEVEL_ENV, "").strip().lower() == "debug"
    for name in (*names, "fairseq_gradinit") if debug else names:
        log = logging.getLogger(name)
        if debug:
            log.setLevel(logging.DEBUG)
        if name != "fairseq_gradinit" and not any(isinstance(f, DebugOnly) for f in log.filters):
            log.addFilter(DebugOnly())


def hide_known_noise() -> bool:
    """Hide the warnings of :data:`KNOWN_NOISE` in this process, unless ``FAIRSEQ_GRADINIT_WARNINGS=all``
    or the user set warning filters (``-W``, ``PYTHONWARNINGS``), and move fairseq's printouts to the debug
    level (:func:`quiet_printouts`). Returns whether the warnings are hidden."""
    quiet_printouts()
    # fairseq's data iterators set PYTHONWARNINGS to this for their worker processes: not the user's choice.
    user_options = [o for o in sys.warnoptions if o != FAIRSEQ_WORKER_FILTER]
    if os.environ.get(SHOW_ALL_ENV, "").strip().lower() == "all" or user_options:
        return False
    for message in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message)
    return True


def quiet_command(main: Callable[[], Optional[int]], name: str) -> Callable[[], int]:
    """The console-script function ``name``: ``main()`` with :data:`KNOWN_NOISE` hidden, and the one
    top-level handler of every command: Ctrl-C that ``main`` does not handle itself ends it with one line
    ``NAME: interrupted (Ctrl-C)`` and exit status 130, an ``OSError`` (a file that cannot be read or
    written, a full disk, a closed pipe) with one line ``NAME: error: ...`` and exit status 1, never a
    traceback. ``run.command`` is ``name``."""

    def run() -> int:
        hide_known_noise()
        try:
            return main() or 0
        except KeyboardInterrupt:
            print(f"{name}: interrupted (Ctrl-C); what it had not written yet was not written", file=sys.stderr)
            return 130
        except OSError as e:
            print(f"{name}: error: {os_error_text(e)}", file=sys.stderr)
            return 1

    run.__name__ = "run"
    run.__doc__ = f"The ``{name}`` command: ``{main.__name__}()`` with known third-party warnings hidden."
    run.command = name
    return run


def os_error_text(e: OSError) -> str:
    """``e`` in one line: what failed and on which file ('No space left on device: out/x.json')."""
    files = [f for f in (e.filename, e.filename2) if f is not None]
    text = e.strerror or str(e)
    return f"{text}: {' -> '.join(map(str, files))}" if files else text
