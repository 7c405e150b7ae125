"""The one check of the paths a command writes, shared by every command of the package (the tools, the
study and the plugin's save folder), made before any long work.

A path a command writes must not be one of its inputs: compared resolved (symlinks and hard links
followed), and an input inside a folder the command replaces counts too. An existing file there must be
of the kind the command writes (a JSON result where a JSON result goes, text where text goes, a PNG
where a PNG goes): anything else (a checkpoint, the references, a folder) would be destroyed. A file the
same command wrote before may be replaced, so a command can be run again. Problems are
:class:`OutputError` (a ``ValueError``), one line that says what to do; the commands report it as an
argument error (exit status 2)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]

#: Bytes of an existing file read to tell its kind (a JSON result is read whole, up to :data:`JSON_LIMIT`).
HEAD_BYTES = 1 << 16
JSON_LIMIT = 64 << 20


class OutputError(ValueError):
    """A path a command would write that is one of its inputs, or holds a file of another kind."""


@dataclass(frozen=True)
class Kind:
    """What a command writes at a path. ``what`` names it in messages; an existing file there is accepted
    when it starts with ``magic`` (binary formats), or is UTF-8 text (``text``), a JSON object with all of
    ``json_keys`` (a result of the same command), or a folder (``folder``). An empty file is accepted."""

    what: str
    magic: Optional[bytes] = None
    text: bool = False
    json_keys: Tuple[str, ...] = ()
    folder: bool = False


TEXT = Kind("a text file", text=True)
PNG = Kind("a PNG image", magic=b"\x89PNG\r\n\x1a\n")
TAR_GZ = Kind("a .tar.gz archive", magic=b"\x1f\x8b")
FOLDER = Kind("a folder", folder=True)


def json_result(what: str, *keys: str) -> Kind:
    """The kind of a JSON result whose earlier versions hold ``keys``."""
    return Kind(what, text=True, json_keys=keys)


def resolved(path: PathLike) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


def unwritable_folder_reason(path: PathLike) -> Optional[str]:
    """Why no folder can be created or written at ``path`` ('D is a file', 'is below the file F',
    'cannot write into D (permission denied)'), or None. Creates nothing."""
    path = os.path.abspath(os.fspath(path))
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return "is a file, not a folder" if existing == path else f"is below the file {existing}, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot be written: no permission to write into {existing}"
    return None


def _is_or_inside(inp: Path, written: Path) -> bool:
    if inp == written or written in inp.parents:
        return True
    try:
        return os.path.samefile(inp, written)  # a hard link
    except OSError:
        return False


def _flat_inputs(inputs: Mapping[str, Any]) -> Iterable[Tuple[str, Path]]:
    for flag, value in inputs.items():
        values = value if isinstance(value, (list, tuple, set)) else [value]
        for v in values:
            if v is not None and os.fspath(v) != "":
                yield flag, Path(os.fspath(v))


def kind_problem(path: Path, kind: Kind) -> Optional[str]:
    """Why the existing ``path`` is not of ``kind`` (None when it is, or does not exist)."""
    if not os.path.lexists(path):
        return None
    if kind.folder:
        return None if path.is_dir() else "it is a file, not a folder"
    if path.is_dir():
        return "it is a folder"
    if not path.is_file():
        return "it is not a regular file"
    size = path.stat().st_size
    if size == 0:
        return None
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    if kind.magic is not None:
        return None if head.startswith(kind.magic) else f"it does not start as {kind.what} does"
    if b"\0" in head:
        return "it holds binary data"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not a multi-byte character cut by HEAD_BYTES
            return "it is not UTF-8 text"
    if kind.json_keys:
        try:
            if size > JSON_LIMIT:
                raise ValueError("too large")
            obj = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            return "it is not JSON"
        if not isinstance(obj, dict) or not set(kind.json_keys) <= set(obj):
            keys = sorted(obj)[:5] if isinstance(obj, dict) else type(obj).__name__
            return f"its keys are {keys}, not those of {kind.what}"
    return None


def check_output(flag: str, path: PathLike, kind: Kind, *, inputs: Optional[Mapping[str, Any]] = None,
                 writes: Sequence[str] = ()) -> None:
    """Refuse (:class:`OutputError`) to write ``path`` (given as ``flag``) when it is, or replaces, one of
    ``inputs`` (``{flag: path or paths}``), when an existing file there is not of ``kind``, or when no
    file can be written there. ``writes``: for a folder, the names written into it (each may replace an
    input: an input inside them counts)."""
    target = resolved(path)
    written = [target / name for name in writes] if kind.folder else [target]
    for inp_flag, inp in _flat_inputs(inputs or {}):
        real = resolved(inp)
        for w in written:
            if _is_or_inside(real, w):
                what = "is" if w == real else ("holds" if w in real.parents else "is a link to")
                where = f"{flag} {path}" + (f" (its {w.relative_to(target)})" if w != target else "")
                raise OutputError(f"{where} {what} the input {inp_flag} {inp}: writing it would destroy that input; "
                                  f"give {flag} another path")
    problem = kind_problem(target, kind)
    if problem:
        raise OutputError(f"{flag} {path} exists and {problem}; this command writes {kind.what} there and would "
                          f"replace it: give {flag} another path, or remove it yourself if it is no longer needed")
    reason = unwritable_folder_reason(target if kind.folder else target.parent)
    if reason:
        where = target if kind.folder else target.parent
        raise OutputError(f"{flag} {path}: {where} {reason}; give a path you can write")


def utf8_problem(path: PathLike) -> Optional[str]:
    """Where ``path`` stops being UTF-8 text ('line 3: byte 0xe9 at byte 4 of the line is not UTF-8'), or
    None; raises OSError when it cannot be read."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return f"line {n}: byte 0x{line[e.start]:02x} at byte {e.start + 1} of the line is not UTF-8"
    return None
