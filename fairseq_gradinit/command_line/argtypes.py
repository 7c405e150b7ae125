"""argparse types for the numbers of our command-line tools: a bad value is argparse's own one-line
error ('argument --flag: invalid value ...: expected ...', exit status 2) before anything runs. Also
:func:`parse_betas`, fairseq's ``--adam-betas`` format, read by the RAdam optimizer and the plugin's checks."""
from __future__ import annotations

import argparse
import ast
import math
import os
from typing import Any, Callable, Optional

from ..core.errors import OptionValueError


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer >= {minimum}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"invalid value {value}: expected an integer >= {minimum}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


def float_in(low: float, high: Optional[float] = None, *, low_open: bool = False) -> Callable[[str], float]:
    """A finite float in [low, high] (``(low, high]`` with ``low_open``; no upper end with ``high`` None)."""
    left = "(" if low_open else "["
    allowed = f"a number in {left}{low:g}, {high:g}]" if high is not None else \
        f"a finite number {'>' if low_open else '>='} {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {allowed}") from None
        if not math.isfinite(value) or value < low or (low_open and value == low) or \
                (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"invalid value {value:g}: expected {allowed}")
        return value

    parse.__name__ = "float"
    return parse


positive_int = int_at_least(1)


def parse_betas(value: Any) -> tuple:
    """``"(0.9, 0.98)"`` or a sequence -> a pair of floats; an
    :class:`~fairseq_gradinit.core.errors.OptionValueError` says what is expected."""
    pair = "expected a pair like '(0.9, 0.98)'"
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)  # fairseq's own format for --adam-betas
        except (ValueError, SyntaxError) as e:
            raise OptionValueError("--adam-betas", f"{value!r}: {pair}", reason=pair) from e
    try:
        betas = tuple(float(b) for b in value)
    except (TypeError, ValueError):
        raise OptionValueError("--adam-betas", f"{value!r}: {pair}", reason=pair) from None
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        expected = "expected two numbers in [0, 1), like '(0.9, 0.98)'"
        raise OptionValueError("--adam-betas", f"{value!r}: {expected}", reason=expected)
    return betas


def output_prefix(text: str):
    """An ``--out`` prefix that names a file (``PREFIX.json`` and the like are written beside it), as a
    :class:`~pathlib.Path`; an empty one, ``.``, ``..``, ``/`` or one ending in a separator is refused."""
    from pathlib import Path

    if not text or text.endswith(("/", os.sep)) or Path(text).name in ("", ".", ".."):
        example = os.path.join(text or ".", "curves")
        raise argparse.ArgumentTypeError(f"{text!r} names a folder, not a file prefix: give a prefix such as "
                                         f"{example!r} (it writes PREFIX.json, PREFIX.md and PREFIX.png)")
    return Path(text)
