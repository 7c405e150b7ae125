"""The one check of the paths a command writes, shared by every command of the package (the tools, the
study and the plugin's save folder), made before any long work.

A path a command writes must not be one of its inputs: compared resolved (symlinks and hard links
followed), and an input inside a folder the command replaces counts too. An existing file there is
replaced only when the same command wrote it: every file a command writes carries its mark (a JSON
object's ``written_by`` key, a first-line header of a text file, a PNG's ``Software`` text, the name in
a ``.tar.gz``'s gzip header), so a command can be run again, while anything else there (a checkpoint, the
references, a user's notes, another command's output, a folder) is refused. Problems are
:class:`OutputError` (a ``ValueError``), one line that says what to do; the commands report it as an
argument error (exit status 2).

The JSON every command writes goes through :func:`write_json`: strict JSON (a number that is not finite
is written as ``null``, never as ``NaN``, which strict readers refuse), written atomically."""
from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]

#: Bytes of an existing file read to tell its kind (a JSON result is read whole, up to :data:`JSON_LIMIT`).
HEAD_BYTES = 1 << 16
JSON_LIMIT = 64 << 20


class OutputError(ValueError):
    """A path a command would write that is one of its inputs, or holds a file of another kind."""


#: The key of a JSON object that names the command that wrote it.
MARKER = "written_by"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Kind:
    """What ``command`` writes at a path. ``what`` names it in messages. An existing file there is
    accepted when that command wrote it: a JSON object whose ``written_by`` is ``command`` and that holds
    ``json_keys`` (one without ``written_by`` but with all of ``json_keys``: an earlier version's result);
    a text file whose first line is ``header``; a PNG whose ``Software`` text is ``command``; a
    ``.tar.gz`` whose gzip header names ``command``. A folder kind (``folder``) accepts a folder. An
    empty file is accepted."""

    what: str
    command: Optional[str] = None
    magic: Optional[bytes] = None
    text: bool = False
    json_keys: Tuple[str, ...] = ()
    folder: bool = False
    header: Optional[str] = None


FOLDER = Kind("a folder", folder=True)


def json_result(what: str, *keys: str, command: Optional[str] = None) -> Kind:
    """The kind of a JSON result of ``command`` (marked ``written_by``) whose earlier versions hold ``keys``."""
    return Kind(what, command=command, text=True, json_keys=keys)


def text_output(what: str, command: str, *, markdown: bool = False) -> Kind:
    """The kind of a text file of ``command``: its first line is :func:`header_line`."""
    return Kind(what, command=command, text=True, header=header_line(command, markdown=markdown))


def header_line(command: str, *, markdown: bool = False) -> str:
    """The first line of every text file ``command`` writes (an HTML comment in Markdown, which renders
    nothing), by which the command knows the file as its own."""
    text = f"written by {command}; it replaces this file when run again"
    return f"<!-- {text} -->" if markdown else f"# {text}"


def png_output(command: str) -> Kind:
    """The kind of a PNG of ``command`` (its ``Software`` text: :func:`png_metadata`)."""
    return Kind("a PNG image", command=command, magic=PNG_MAGIC)


def png_metadata(command: str) -> dict:
    """The ``metadata`` of matplotlib's ``savefig`` that marks a PNG as ``command``'s."""
    return {"Software": command}


def tar_gz_output(command: str) -> Kind:
    """The kind of a ``.tar.gz`` of ``command`` (its gzip header names it: :func:`tar_gz_name`)."""
    return Kind("a .tar.gz archive", command=command, magic=GZIP_MAGIC)


def tar_gz_name(command: str) -> str:
    """The name stored in the gzip header of ``command``'s archives (:func:`marked_tar_gz`)."""
    return f"{command}.tar"


@contextlib.contextmanager
def marked_tar_gz(path: PathLike, command: str) -> Iterator[tarfile.TarFile]:
    """A ``.tar.gz`` open for writing at ``path`` whose gzip header names ``command`` (:func:`tar_gz_name`)."""
    with open(path, "wb") as raw, gzip.GzipFile(filename=tar_gz_name(command), mode="wb", fileobj=raw) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        yield tar


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
        try:
            read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        except (OSError, AttributeError):  # no statvfs on this system
            read_only = False
        if read_only:
            return f"cannot be written: {existing} is on a read-only file system"
        return f"cannot be written: no permission to write into {existing}"
    return None


def name_too_long(flag: str, path: PathLike, *, also: Sequence[Tuple[str, str]] = ()) -> Optional[str]:
    """Why ``path`` (given as ``flag``) cannot be created because one of its names (or one of ``also``:
    ``(name, what)`` of files beside it) is longer than the file system allows, or None. Said before
    any work instead of as an ``OSError`` when the first file is written."""
    absolute = os.path.abspath(os.fspath(path))
    existing = absolute
    while not os.path.exists(existing):  # False, not an error, for a name too long to look up
        existing = os.path.dirname(existing)
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for name, what in [(name, "the name") for name in Path(absolute).parts[1:]] + list(also):
        size = len(os.fsencode(name))
        if size > limit:
            shown = name if len(name) <= 40 else name[:40] + "..."
            return (f"{flag} {path}: {what}, {shown!r}, is {size} bytes long, more than the {limit} bytes a file "
                    f"name may have there; give a shorter name")
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
        if not head.startswith(kind.magic):
            return f"it does not start as {kind.what} does"
        return _binary_mark_problem(head, kind)
    if b"\0" in head:
        return "it holds binary data"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not a multi-byte character cut by HEAD_BYTES
            return "it is not UTF-8 text"
    if kind.json_keys or (kind.command and not kind.header):
        return _json_mark_problem(path, size, kind)
    if kind.header is not None:
        first = head.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", errors="replace")
        if first != kind.header:
            return f"its first line is not {kind.header!r}, so {kind.command} did not write it"
    return None


def _json_mark_problem(path: Path, size: int, kind: Kind) -> Optional[str]:
    try:
        if size > JSON_LIMIT:
            raise ValueError("too large")
        obj = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return "it is not JSON"
    if not isinstance(obj, dict):
        return f"it is a JSON {type(obj).__name__}, not {kind.what}"
    owner = obj.get(MARKER)
    if owner is not None and kind.command is not None and owner != kind.command:
        return f"it was written by {owner}, not by {kind.command}"
    if not set(kind.json_keys) <= set(obj) or (owner is None and not kind.json_keys):
        return f"its keys are {sorted(obj)[:5]}, not those of {kind.what}"
    return None


def _binary_mark_problem(head: bytes, kind: Kind) -> Optional[str]:
    if kind.command is None:
        return None
    mark = _png_software(head) if kind.magic == PNG_MAGIC else _gzip_name(head)
    if mark != (kind.command if kind.magic == PNG_MAGIC else tar_gz_name(kind.command)):
        return f"{kind.command} did not write it (it does not carry its mark)"
    return None


def _png_software(head: bytes) -> Optional[str]:
    """The ``Software`` text of a PNG's chunks before its image data, or None."""
    pos = len(PNG_MAGIC)
    while pos + 8 <= len(head):
        length = int.from_bytes(head[pos:pos + 4], "big")
        ctype, data = head[pos + 4:pos + 8], head[pos + 8:pos + 8 + length]
        if ctype == b"IDAT":
            return None
        if ctype == b"tEXt" and b"\0" in data:
            key, value = data.split(b"\0", 1)
            if key == b"Software":
                return value.decode("latin-1")
        pos += 12 + length
    return None


def _gzip_name(head: bytes) -> Optional[str]:
    """The file name in a gzip header (``FNAME``), or None."""
    if len(head) < 10 or not head[3] & 0x08:
        return None
    pos = 10
    if head[3] & 0x04:  # FEXTRA comes first
        pos += 2 + int.from_bytes(head[10:12], "little")
    end = head.find(b"\0", pos)
    return head[pos:end].decode("latin-1") if end > 0 else None


def check_output(flag: str, path: PathLike, kind: Kind, *, inputs: Optional[Mapping[str, Any]] = None,
                 writes: Sequence[str] = ()) -> None:
    """Refuse (:class:`OutputError`) to write ``path`` (given as ``flag``) when it is, or replaces, one of
    ``inputs`` (``{flag: path or paths}``), when an existing file there is not of ``kind``, or when no
    file can be written there. ``writes``: for a folder, the names written into it (each may replace an
    input: an input inside them counts)."""
    target = resolved(path)
    written = [target / name for name in writes] if kind.folder else [target]
    too_long = name_too_long(flag, path, also=[(name, "the name of a file it writes there") for name in writes]
                             if kind.folder else ())
    if too_long:
        raise OutputError(too_long)
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


def text_lines(path: PathLike) -> List[str]:
    """The lines of the UTF-8 text file ``path``, split at ``\\n`` only (a CRLF line ending is removed):
    a lone CR, a form feed or a Unicode line separator inside a line stays in that line, where universal
    newlines and :meth:`str.splitlines` would split it and shift every later line."""
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def finite_json(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None (JSON ``null``), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def json_text(obj: Any, *, command: Optional[str] = None, indent: Optional[int] = 1, **kwargs) -> str:
    """Strict JSON of ``obj`` (:func:`finite_json`: no ``NaN``/``Infinity``), marked ``written_by``
    ``command`` (a mapping's first key) when given."""
    if command is not None:
        obj = {MARKER: command, **{k: v for k, v in obj.items() if k != MARKER}}
    return json.dumps(finite_json(obj), indent=indent, allow_nan=False, **kwargs)


def write_json(path: PathLike, obj: Any, *, command: Optional[str] = None, indent: Optional[int] = 1,
               **kwargs) -> None:
    """Write :func:`json_text` of ``obj`` to ``path`` atomically (readers see the old file or the whole new
    one); the folder is created if needed."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    text = json_text(obj, command=command, indent=indent, **kwargs) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp creates it 0600: the permissions of an ordinary open()
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_atomic(save: Any, path: PathLike) -> None:
    """``save(tmp)`` (e.g. ``lambda f: torch.save(obj, f)``) into a temporary file beside ``path``, then
    moved over ``path``; the temporary file is removed whatever fails. torch reports a failed write (a full
    disk) as ``RuntimeError`` ('PytorchStreamWriter failed writing file ...'): it is raised as the
    ``OSError`` it is (``No space left on device`` where the disk is full), which the commands report in one
    line. Every writer of a torch file in the package goes through here."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        try:
            save(tmp)
        except RuntimeError as e:
            raise write_failure(e, path) from None
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp creates it 0600: the permissions of an ordinary open()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_failure(error: RuntimeError, path: PathLike) -> OSError:
    """The ``OSError`` behind torch's ``RuntimeError`` of a failed write of ``path``: ``ENOSPC`` where the
    disk holds less than a megabyte, else ``EIO`` with torch's words."""
    import errno
    import shutil

    try:
        full = shutil.disk_usage(os.path.dirname(os.path.abspath(os.fspath(path)))).free < (1 << 20)
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
    return OSError(errno.EIO, f"writing failed ({type(error).__name__}: {error})", os.fspath(path))
