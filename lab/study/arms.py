"""Arms of a study: the arm-spec language and merging of fairseq-train option lists (pure Python)."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from fairseq_gradinit.files.paths import text_lines, utf8_problem

_ARM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: An arm's name names its folder, and a file system allows 255 bytes per name; the rest is kept for the
#: suffixes the study adds (a seed twin's ``-sN``).
MAX_ARM_NAME = 128
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_]\w*)\}")


# ------------------------------------------------------------------------------------------------
# arms and their arguments
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """One training run: ``args`` are added to the base, ``drop`` removes base options (a flag
    cannot be negated on fairseq's command line), ``data`` names the data-bin (``main`` or a key of
    ``--data-bin KEY=PATH``)."""

    name: str
    args: Tuple[str, ...] = ()
    drop: Tuple[str, ...] = ()
    data: str = "main"
    note: str = ""

    def __post_init__(self):
        if not _ARM_NAME_RE.match(self.name):
            raise ValueError(f"arm name {self.name!r}: use letters, digits, '.', '_' and '-' "
                             "(it names the arm's folder)")
        if len(self.name) > MAX_ARM_NAME:
            raise ValueError(f"arm name {self.name[:40]}... is {len(self.name)} characters long; use at most "
                             f"{MAX_ARM_NAME} (it names the arm's folder, and a file name has at most 255 bytes)")
        for opt in self.drop:
            if not opt.startswith("--"):
                raise ValueError(f"arm {self.name}: dropped option {opt!r} must start with '--'")

    def spec(self) -> str:
        """The arm as ``NAME[@DATA]=ARGS`` (what :func:`parse_arm_spec` reads)."""
        head = self.name if self.data == "main" else f"{self.name}@{self.data}"
        return head + "=" + shlex.join([f"!{d}" for d in self.drop] + list(self.args))


def parse_arm_spec(spec: str, *, note: str = "") -> Arm:
    """``NAME[@DATA]=ARGS`` -> :class:`Arm`. In ARGS, ``!--flag`` drops ``--flag`` (and its
    values) from the base, e.g. ``sep@separate=!--share-all-embeddings --share-decoder-input-output-embed``."""
    head, sep, rest = spec.partition("=")
    if not sep or not head.strip():
        raise ValueError(f"arm {spec!r}: expected NAME[@DATA]=ARGS, e.g. x999='--adam-betas \"(0.9, 0.999)\"'")
    name, _, data = head.strip().partition("@")
    try:
        tokens = shlex.split(rest)
    except ValueError as e:
        raise ValueError(f"arm {name}: cannot split its arguments ({e}): {rest!r}") from None
    drop = tuple(t[1:] for t in tokens if t.startswith("!"))
    args = tuple(t for t in tokens if not t.startswith("!"))
    return Arm(name=name, args=args, drop=drop, data=data or "main", note=note)


def read_arms_file(path: Path) -> List[Arm]:
    """Arms from a text file: one ``NAME[@DATA]=ARGS`` per line; ``#`` starts a comment line, a
    line ending in ``\\`` continues on the next. A file that cannot be read, or is not UTF-8 text, is
    a ValueError naming it (and the line)."""
    try:
        problem = utf8_problem(path)
        lines = text_lines(path) if problem is None else []
    except OSError as e:
        raise ValueError(f"--arms-file {path}: cannot read it ({e.strerror or e}); give a text file of arms, "
                         "one NAME[@DATA]=ARGS per line") from None
    if problem is not None:
        raise ValueError(f"--arms-file {path}, {problem}; the arms file must be UTF-8 text")
    arms, pending = [], ""
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = pending + line, ""
        try:
            arms.append(parse_arm_spec(text))
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    if pending:
        raise ValueError(f"{path}: the last line ends in '\\' with nothing after it")
    return arms


def option_groups(argv: Sequence[str]) -> List[List[str]]:
    """Split a command line into ``[option, value, ...]`` groups (a leading positional group too).
    Values never start with ``--`` in fairseq's options (negative numbers start with a single ``-``)."""
    groups: List[List[str]] = []
    for token in argv:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def _option_name(token: str) -> Optional[str]:
    return token.split("=", 1)[0] if token.startswith("--") else None


def merge_args(base: Sequence[str], args: Sequence[str], drop: Sequence[str] = ()) -> List[str]:
    """``base`` without the options that ``args`` sets again or ``drop`` names, then ``args``."""
    override = {_option_name(g[0]) for g in option_groups(args)} | set(drop)
    kept = [g for g in option_groups(base) if _option_name(g[0]) not in override]
    return [t for g in kept for t in g] + list(args)


def has_option(argv: Sequence[str], name: str) -> bool:
    return any(_option_name(t) == name for t in argv)


def option_value(argv: Sequence[str], name: str) -> Optional[str]:
    """The value of the last ``name`` in a command line, given as ``--name VALUE`` or ``--name=VALUE`` (as
    fairseq's parser reads both), or None where it is not given or has no value."""
    value = None
    for group in option_groups(argv):
        if _option_name(group[0]) == name:
            head = group[0].split("=", 1)
            value = head[1] if len(head) == 2 else (group[1] if len(group) > 1 else None)
    return value


def substitute_files(argv: Sequence[str], files: Mapping[str, str], *, arm: str) -> List[str]:
    """Replace ``{KEY}`` in the arguments with ``files[KEY]`` (``--file KEY=PATH``)."""
    def one(token: str) -> str:
        def repl(m):
            key = m.group(1)
            if key not in files:
                known = ", ".join(sorted(files)) or "none"
                raise ValueError(f"arm {arm}: {{{key}}} is not a known file (known: {known}); "
                                 f"pass --file {key}=PATH")
            return str(files[key])
        return _PLACEHOLDER_RE.sub(repl, token)
    return [one(t) for t in argv]
