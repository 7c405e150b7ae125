"""The errors of invalid settings, with their parts as attributes: :class:`ConfigError` (a field of a config
dataclass of the engine) and :class:`OptionValueError` (a value given for a command-line option). Front ends
word them from the attributes, never by taking their text apart. A message that tells the user which option to
change names it as the interface they used does (:data:`OptionNamer`: :func:`keyword_name` for a Python caller,
:func:`flag_name` for the command line)."""
from __future__ import annotations

from typing import Any, Callable, Optional


class ConfigError(ValueError):
    """Field ``field`` of the config ``owner`` (a class name, e.g. ``"GradInitConfig"``) holds ``value``,
    and ``expected`` says what it accepts. A ``ValueError``: its text reads
    ``GradInitConfig.eta=0 is invalid: expected a finite number > 0``; front ends that name the field
    otherwise (a command-line flag) read the attributes, never the text."""

    def __init__(self, field: str, value: Any, expected: str, *, owner: str):
        self.field, self.value, self.expected, self.owner = field, value, expected, owner
        super().__init__(f"{owner}.{field}={value!r} is invalid: expected {expected}")

    def __reduce__(self):  # picklable (torch.distributed and multiprocessing pass errors between processes)
        return _rebuild, (self.field, self.value, self.expected, self.owner)


def _rebuild(field, value, expected, owner):
    return ConfigError(field, value, expected, owner=owner)


class OptionValueError(ValueError):
    """The value given for the command-line option ``flag`` is refused. Its text reads ``flag + sep + detail``
    (``--gradinit-optimizer 'x': expected one of sgd, adam``: ``detail`` is what follows the flag);
    ``reason`` is what is wrong without the value (``expected one of sgd, adam``; the ``detail`` where not
    given), for a message that names the value otherwise."""

    def __init__(self, flag: str, detail: str, *, reason: Optional[str] = None, sep: str = " "):
        self.flag, self.detail, self.sep = flag, detail, sep
        self.reason = detail if reason is None else reason
        super().__init__(f"{flag}{sep}{detail}")

    def __reduce__(self):
        return _rebuild_option_error, (self.flag, self.detail, self.reason, self.sep)


def _rebuild_option_error(flag, detail, reason, sep):
    return OptionValueError(flag, detail, reason=reason, sep=sep)


#: How a message names an option (a config field, ``"iters"``) for the interface the user called.
OptionNamer = Callable[[str], str]


def keyword_name(name: str) -> str:
    """A Python caller's name of the option ``name``: the keyword argument (``iters=...``)."""
    return f"{name}=..."


def flag_name(name: str, prefix: str = "--gradinit-") -> str:
    """The command line's name of the option ``name``: its flag (``--gradinit-iters``)."""
    return prefix + name.replace("_", "-")
