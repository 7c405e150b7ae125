"""The engine's options (:func:`~fairseq_gradinit.core.options.options_of`) in the forms the commands and
the docs use: ``argparse`` flags (:func:`add_arguments`, for ``scripts/train_vision.py``) and Markdown lists
(:func:`markdown_table`, for ``docs/options.md`` and the fairseq plugin's list). Kept out of the engine, which
is pure PyTorch and parses option values itself (:meth:`~fairseq_gradinit.core.options.OptionSpec.parse`)."""
from __future__ import annotations

import argparse
from typing import Iterable, List

from ..core.errors import OptionValueError
from ..core.options import OptionSpec


def add_arguments(parser, specs: Iterable[OptionSpec], *, prefix: str = "--gradinit-") -> None:
    """Add one ``argparse`` option per spec (``prefix`` + name) to ``parser`` (or an argument group),
    with its help, choices and default; values are parsed by :meth:`OptionSpec.parse`."""
    for spec in specs:
        if spec.python_only:
            continue
        metavar = {"choice": "{" + ",".join(spec.choices or ()) + "}", "bool": "{true,false}",
                   "pair": "'(B1, B2)'", "bounds": "'[(SELECT, MIN, MAX), ...]'"}.get(spec.kind)
        shown = spec.to_text(spec.default) if spec.kind in ("pair", "bounds", "bool") else spec.default
        help_text = spec.help if spec.default_text else f"{spec.help} (default: {shown})"
        # '%(default).0s' prints nothing, and keeps ArgumentDefaultsHelpFormatter from adding the raw
        # default after the one described here.
        help_text = help_text.replace("%", "%%") + "%(default).0s"
        parser.add_argument(spec.flag(prefix), dest=spec.flag(prefix)[2:].replace("-", "_"), default=spec.default,
                            type=_argparse_type(spec), metavar=metavar, help=help_text)


def _argparse_type(spec: OptionSpec):
    def convert(text):
        try:
            return spec.parse(text)
        except OptionValueError as e:  # argparse names the flag itself
            raise argparse.ArgumentTypeError(e.detail) from None
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = spec.kind  # argparse names the type in its "invalid <type> value" message
    return convert


#: What the generated tables say of the options marked ``experimental``.
EXPERIMENTAL_NOTE = (
    "**Experimental.** Research settings: each tests one explanation of a failure or one remedy "
    "([phase-options.md](phase-options.md), [remedies.md](remedies.md)); their defaults run GradInit as the "
    "paper describes it.")


def markdown_table(specs: Iterable[OptionSpec], *, prefix: str = "--gradinit-", keyword: bool = False) -> str:
    """The options as a Markdown reference, one list item per option (flag or keyword, default, what it does;
    a table would hold cells of several hundred characters): the established ones, then those marked
    ``experimental`` under :data:`EXPERIMENTAL_NOTE`."""
    specs = list(specs)
    stable = [s for s in specs if not s.experimental]
    experimental = [s for s in specs if s.experimental]
    text = _table(stable, prefix=prefix, keyword=keyword)
    if experimental:
        text += "\n" + EXPERIMENTAL_NOTE + "\n\n" + _table(experimental, prefix=prefix, keyword=keyword)
    return text


def _table(specs: List[OptionSpec], *, prefix: str, keyword: bool) -> str:
    rows = []
    for spec in specs:
        name = spec.name if keyword else spec.flag(prefix)
        if spec.choices and not keyword:
            name += " {" + ",".join(spec.choices) + "}"
        default = spec.default_text or (repr(spec.default) if keyword else (spec.to_text(spec.default) or "none"))
        rows.append(f"- `{name}` (default: {default}): {spec.about}")
    return "\n".join(rows) + "\n"
