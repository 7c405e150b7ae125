"""Writing the plugin's JSON files into a run's --save-dir."""
from __future__ import annotations

import contextlib
import glob
import os
import tempfile
from typing import List, Optional

from ...files.paths import json_text
from ...files.paths import unwritable_folder_reason  # noqa: F401  (the one path check, shared with the commands)



def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_json(path: str, obj: dict) -> None:
    """Write ``obj`` to ``path`` so that readers see the old file or the whole new one, never a
    part (a killed run leaves at most a ``.{stem}.*.json`` temporary file beside it). Strict JSON: a
    number that is not finite is written as ``null`` (:func:`~fairseq_gradinit.files.paths.json_text`)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    stem = os.path.splitext(os.path.basename(path))[0]
    fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json_text(obj))
        # mkstemp creates the file 0600; give it the permissions an ordinary open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def remove_stale_temp_files(directory: str, name: str) -> List[str]:
    """Remove the temporary files that a killed :func:`atomic_write_json` of ``name`` left in
    ``directory`` (SIGKILL leaves no chance to clean up); returns their paths."""
    stem = os.path.splitext(name)[0]
    removed = []
    for tmp in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(stem)}.*.json")):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
            removed.append(tmp)
    return removed


def write_result(path: str, obj: dict) -> Optional[str]:
    """:func:`atomic_write_json` of a result that exists only in memory. When ``path`` cannot be
    written (disk full, permissions), the result goes to a file in the temporary folder instead and
    the message returned says where both went; None when ``path`` was written."""
    try:
        atomic_write_json(path, obj)
        return None
    except OSError as e:
        reason = f"{e.strerror or e}"
    try:
        fd, fallback = tempfile.mkstemp(prefix="gradinit-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(json_text(obj))
    except OSError as e:
        return f"could not write {path} ({reason}), nor a copy in {tempfile.gettempdir()} ({e.strerror or e}): the result is lost"
    return (f"could not write {path} ({reason}); the result was saved to {fallback} instead: free space (or fix the "
            f"permissions) and copy it to {path}, or pass --gradinit-init-file {fallback} to apply it without "
            "computing it again")
