"""The user-facing options of a config dataclass, read from its fields (declared once, in
:mod:`.config` with :func:`~.config.option`).

Each front end derives its options from :func:`options_of`: the fairseq plugin's ``--gradinit-*``
fields, the vision API's keyword arguments and ``scripts/train_vision.py``'s flags. A front end
only says which defaults differ for it (a mapping ``name -> Default``); help texts, choices,
types, parsing from the command line and whether an option changes the result all come from here.
Their argparse flags and Markdown tables are made outside the engine, by
:mod:`fairseq_gradinit.command_line.option_forms`.
"""
from __future__ import annotations

import ast
import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .config import GradInitConfig, ScaleBound
from .errors import OptionValueError

#: Values that an option's ``kind`` can take (how the command line spells its value).
KINDS = ("float", "int", "str", "choice", "bool", "pair", "bounds", "python")


@dataclass(frozen=True)
class Default:
    """A front end's own default of an option; ``text`` describes a derived default (``value``
    None, e.g. "the training --lr") in the help."""

    value: Any
    text: str = ""
    #: Whether the front end lists the option with the research settings (None: as declared); a research
    #: setting of the engine that a front end turns on by default is one of its main options there.
    experimental: Optional[bool] = None


@dataclass(frozen=True)
class OptionSpec:
    """One option: the config field ``name``, its default, what it does (``about``; with the default
    described in words, ``default_text``, it reads as :attr:`help`), allowed strings and type."""

    name: str
    default: Any
    about: str
    kind: str
    optional: bool               # None is allowed (and means "not set" or "derived")
    choices: Optional[Tuple[str, ...]]
    result: bool                 # changes the learned scales (compared by fingerprints)
    python_only: bool
    experimental: bool = False   # a research setting, listed apart in the generated tables
    default_text: str = ""       # a derived default in words ("the training --lr"); "" where the value says it

    @property
    def help(self) -> str:
        return self.about + (f" (default: {self.default_text})" if self.default_text else "")

    def flag(self, prefix: str = "--gradinit-") -> str:
        return prefix + self.name.replace("_", "-")

    def with_default(self, default: Default) -> "OptionSpec":
        experimental = self.experimental if default.experimental is None else default.experimental
        return dataclasses.replace(self, default=default.value, default_text=default.text,
                                   optional=self.optional or default.value is None, experimental=experimental)

    def parse(self, text: Any) -> Any:
        """The value of a command-line string (values that are not strings pass through)."""
        if isinstance(text, enum.Enum):  # fairseq's ChoiceEnum members, from configs built by hydra
            text = str(text.value)
        if not isinstance(text, str):
            return text
        if self.optional and text.strip().lower() in ("none", "null", ""):
            return None
        if self.kind == "str":
            return text
        if self.kind == "float":
            return float(text)
        if self.kind == "int":
            return int(text)
        if self.kind == "bool":
            low = text.strip().lower()
            if low in ("true", "yes", "1", "on"):
                return True
            if low in ("false", "no", "0", "off"):
                return False
            raise OptionValueError(self.flag(), f"{text!r}: expected true or false", reason="expected true or false")
        if self.kind == "choice":
            if text not in (self.choices or ()):
                expected = f"expected one of {', '.join(self.choices or ())}"
                raise OptionValueError(self.flag(), f"{text!r}: {expected}", reason=expected)
            return text
        if self.kind == "pair":
            try:
                value = tuple(float(v) for v in ast.literal_eval(text))
            except (ValueError, SyntaxError, TypeError):
                value = ()
            if len(value) != 2:
                expected = "expected two numbers, e.g. '(0.9, 0.98)'"
                raise OptionValueError(self.flag(), f"{text!r} is invalid: {expected}", reason=expected)
            return value
        if self.kind == "bounds":
            return parse_scale_bounds(text, flag=self.flag())
        raise ValueError(f"option {self.name} cannot be given on the command line")

    def to_text(self, value: Any) -> Optional[str]:
        """The command-line spelling of ``value`` (None stays None)."""
        if value is None:
            return None
        if self.kind == "bounds":
            return repr([tuple(ScaleBound.coerce(b).to_list()) for b in value]) if value else ""
        if self.kind == "pair":
            return repr(tuple(value))
        if self.kind == "bool":
            return "true" if value else "false"
        return str(value)


def parse_scale_bounds(text: Optional[str], *, flag: str = "--gradinit-scale-bounds") -> tuple:
    """A Python-literal list of ``(select, min, max)`` as :class:`ScaleBound` objects."""
    if not text:
        return ()
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if isinstance(value, tuple) and value and isinstance(value[0], str):
        value = [value]  # a single bound
    if not isinstance(value, (list, tuple)):
        expected = "expected a list of (select, min, max), e.g. \"[('bias', 0, None), ('norm', None, 100)]\""
        raise OptionValueError(flag, f"{text!r} is invalid: {expected}", reason=expected)
    try:
        return tuple(ScaleBound.coerce(b) for b in value)
    except (TypeError, ValueError) as e:
        raise OptionValueError(flag, f"{text!r} is invalid: {e}", reason=str(e)) from None


def _kind(hint: Any, metadata: Mapping) -> Tuple[str, bool]:
    optional = False
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else hint
    if metadata.get("python_only"):
        return "python", optional
    if metadata.get("choices"):
        return "choice", optional
    if hint is bool:
        return "bool", optional
    if hint is int:
        return "int", optional
    if hint is float:
        return "float", optional
    if hint is str:
        return "str", optional
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "pair", optional
    if origin in (typing.Sequence, list, tuple) or str(origin) == "<class 'collections.abc.Sequence'>":
        return "bounds", optional
    raise TypeError(f"option type {hint!r} has no command-line form; declare it python_only")


def options_of(config_cls=GradInitConfig, *, defaults: Optional[Mapping[str, Default]] = None,
               python_only: bool = True) -> List[OptionSpec]:
    """The options of ``config_cls`` in declaration order, with a front end's ``defaults``
    replacing the declared ones; ``python_only=False`` leaves out those without a command-line form."""
    hints = typing.get_type_hints(config_cls)
    defaults = dict(defaults or {})
    out = []
    for f in dataclasses.fields(config_cls):
        if "help" not in f.metadata:
            continue
        kind, optional = _kind(hints[f.name], f.metadata)
        spec = OptionSpec(name=f.name, default=f.default, about=f.metadata["help"], kind=kind, optional=optional,
                          choices=tuple(f.metadata["choices"]) if f.metadata.get("choices") else None,
                          result=bool(f.metadata.get("result", True)),
                          python_only=bool(f.metadata.get("python_only")),
                          experimental=bool(f.metadata.get("experimental")),
                          default_text=f.metadata.get("default_text") or "")
        if f.name in defaults:
            spec = spec.with_default(defaults.pop(f.name))
        if python_only or not spec.python_only:
            out.append(spec)
    if defaults:
        raise ValueError(f"defaults for unknown options of {config_cls.__name__}: {sorted(defaults)}")
    return out


def result_options(config_cls=GradInitConfig) -> Tuple[str, ...]:
    """Names of the options that change the learned scales."""
    return tuple(s.name for s in options_of(config_cls) if s.result)


def values_from(source: Any, specs: Iterable[OptionSpec], *, prefix: str = "") -> Dict[str, Any]:
    """``{name: value}`` read from the attributes ``prefix + name`` of ``source`` (a namespace or
    config; a missing attribute takes the option's default), command-line strings parsed; a bad value
    raises :class:`~.errors.OptionValueError` naming its flag."""
    out = {}
    for spec in specs:
        try:
            out[spec.name] = spec.parse(getattr(source, prefix + spec.name, spec.default))
        except OptionValueError:
            raise
        except ValueError as e:  # float() and int() name no flag
            raise OptionValueError(spec.flag(), str(e), sep=": ") from None
    return out
