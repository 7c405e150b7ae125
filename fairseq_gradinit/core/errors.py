"""The error a config dataclass of the engine raises for an invalid field: :class:`ConfigError`."""
from __future__ import annotations

from typing import Any


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
