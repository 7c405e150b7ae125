"""One archive of everything a study exports (``python -m lab.study --archive PATH.tar.gz``): summaries,
curves, every arm's logs, monitor records and scales, and the GradInit groups it used, so that a call
whose output must come back as few files returns one, and a later call can reuse its GradInit groups
(unpack it and pass ``--gradinit-cache DIR/gradinit``). Checkpoints stay out."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence

from fairseq_gradinit.files.paths import marked_tar_gz

#: Files of the study folder, where they exist.
SUMMARY_FILES = ("study.json", "study.log", "curves.csv", "curves.png", "curves.md", "bleu.json")
#: Files of each arm's folder (``arms/NAME/``), where they exist: its log, BLEU result and log, the
#: measured decode rate, the training monitor's records and the scales it applied or computed.
ARM_FILES = ("train.log", "bleu.json", "bleu.log", "bleu.progress.json", "monitor.jsonl", "gradinit.json")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
#: The command whose mark the archive's gzip header carries (an existing archive is replaced only then).
COMMAND = "python -m lab.study"


def check_archive_path(path: Path) -> Path:
    """``path`` if it names a gzip tarball whose folder exists or can be made (ValueError otherwise)."""
    if not str(path).endswith(ARCHIVE_SUFFIXES):
        raise ValueError(f"--archive {path}: name a .tar.gz (or .tgz) file")
    if path.is_dir():
        raise ValueError(f"--archive {path} is a directory: name a .tar.gz file")
    return path


def pack_study(out: Path, dest: Path, *, cache_dir: Path, groups: Optional[Sequence[str]] = None) -> List[str]:
    """Write ``dest`` (a .tar.gz) with the study's files and its GradInit groups; returns the member names.

    ``groups``: the ``gi-KEY`` names the study used (their folders in ``cache_dir``, and the
    ``failed-gi-KEY`` folders of phases that failed); None packs every group in ``cache_dir`` (a study
    that ended before it could list them).
    """
    out, cache_dir = Path(out), Path(cache_dir)
    dest = check_archive_path(Path(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    entries = [(out / name, name) for name in SUMMARY_FILES]
    arms_dir = out / "arms"
    for arm_dir in sorted(arms_dir.iterdir()) if arms_dir.is_dir() else []:
        entries += [(arm_dir / name, f"arms/{arm_dir.name}/{name}") for name in ARM_FILES]
    if groups is None:
        names = sorted(p.name for p in cache_dir.glob("gi-*")) if cache_dir.is_dir() else []
    else:
        names = list(groups)
    for g in names:
        for folder in (cache_dir / g, cache_dir / f"failed-{g}"):
            if folder.is_dir():
                entries += [(f, f"gradinit/{folder.name}/{f.relative_to(folder).as_posix()}")
                            for f in sorted(folder.rglob("*")) if f.is_file()]
    tmp = dest.with_name(dest.name + ".part")
    members = []
    with marked_tar_gz(tmp, COMMAND) as tar:
        for path, arcname in entries:
            if path.is_file():
                tar.add(path, arcname=arcname)
                members.append(arcname)
    os.replace(tmp, dest)
    return members
