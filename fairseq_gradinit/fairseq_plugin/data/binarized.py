"""A data-bin's binarized files (``fairseq-preprocess``'s ``.idx``/``.bin`` pairs), checked against each
other before a run reads them.

fairseq reads a split's ``.idx`` when it loads the split, and its ``.bin`` one sample at a time: a
``.bin`` shorter than its ``.idx`` says fails at the first batch that reaches the missing end (in the
GradInit phase, or hours into training), a damaged ``.idx`` fails when the split is loaded (a
traceback) or points into the wrong tokens. The layouts are fairseq 0.12.3's
(``fairseq.data.indexed_dataset``): ``MMapIndexedDataset.Index`` (``--dataset-impl mmap``, the default) and
``IndexedDataset`` (``lazy``/``cached``); files of other layouts are left to fairseq.
"""
import os
import re
import struct
from typing import Iterator, Optional, Sequence

import numpy as np

#: The first bytes of an ``.idx`` of each layout.
MMAP_MAGIC = b"MMIDIDX\x00\x00"
LEGACY_MAGIC = b"TNTIDX\x00\x00"
#: fairseq's token type codes (``indexed_dataset._code_to_dtype``) -> bytes per token.
TOKEN_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 8, 8: 2, 9: 4, 10: 8}


def _damaged(path: str, why: str) -> str:
    return f"{path} is damaged ({why})"


def _mmap_layout(path: str, head: bytes, idx_size: int):
    """(bytes the ``.bin`` must hold, samples) of an ``MMapIndexedDataset`` index, or a message."""
    # magic (9) | version <Q | token type <B | samples <Q | sizes int32[n] | offsets in bytes int64[n]
    if len(head) < 26:
        return _damaged(path, f"{idx_size} bytes, shorter than the 26 of its header")
    (version,) = struct.unpack("<Q", head[9:17])
    code = head[17]
    (count,) = struct.unpack("<Q", head[18:26])
    if version != 1 or code not in TOKEN_BYTES:
        return _damaged(path, f"version {version}, token type {code}: not an index fairseq 0.12.3 writes")
    if idx_size < 26 + 12 * count:
        return _damaged(path, f"{idx_size} bytes, and its header announces {count} samples, which need "
                              f"{26 + 12 * count}")
    sizes = np.fromfile(path, dtype="<i4", count=count, offset=26).astype(np.int64)
    offsets = np.fromfile(path, dtype="<i8", count=count, offset=26 + 4 * count)
    item = TOKEN_BYTES[code]
    ends = np.cumsum(sizes * item)
    starts = ends - sizes * item
    wrong = np.flatnonzero((sizes < 0) | (offsets != starts))
    if wrong.size:
        return _damaged(path, f"the offset of sample #{int(wrong[0])} does not follow the sizes before it")
    return (int(ends[-1]) if count else 0), count


def _legacy_layout(path: str, head: bytes, idx_size: int):
    """(bytes the ``.bin`` must hold, samples) of an ``IndexedDataset`` index, or a message."""
    # magic (8) | version <Q | token type, token bytes <QQ | samples, dims <QQ | dim offsets, data offsets
    # int64[n + 1] each | dims int64[dims]; data offsets count tokens
    if len(head) < 48:
        return _damaged(path, f"{idx_size} bytes, shorter than the 48 of its header")
    version, _, item, count, dims = struct.unpack("<QQQQQ", head[8:48])
    if version != 1 or item < 1:
        return _damaged(path, f"version {version}, {item} bytes per token: not an index fairseq 0.12.3 writes")
    need = 48 + 8 * (2 * (count + 1) + dims)
    if idx_size < need:
        return _damaged(path, f"{idx_size} bytes, and its header announces {count} samples, which need {need}")
    offsets = np.fromfile(path, dtype="<i8", count=count + 1, offset=48 + 8 * (count + 1))
    steps = np.diff(offsets)
    if offsets[0] != 0 or (steps < 0).any():
        return _damaged(path, "its sample offsets do not grow from 0")
    return int(offsets[-1]) * item, count


def binarized_pair_error(idx_path: str) -> Optional[str]:
    """Why the ``.idx`` at ``idx_path`` and its ``.bin`` cannot be read as fairseq reads them (a damaged
    ``.idx``; a ``.bin`` missing, or of another size than the ``.idx`` says: truncated, or from another
    binarization), or None; also None for a layout fairseq infers as another (raw text, ...)."""
    bin_path = idx_path[: -len(".idx")] + ".bin"
    try:
        idx_size = os.path.getsize(idx_path)
        with open(idx_path, "rb") as f:
            head = f.read(48)
        if head.startswith(MMAP_MAGIC):
            layout = _mmap_layout(idx_path, head, idx_size)
        elif head.startswith(LEGACY_MAGIC):
            layout = _legacy_layout(idx_path, head, idx_size)
        else:
            return None
        if isinstance(layout, str):
            return layout
        need, count = layout
        if not os.path.isfile(bin_path):
            return f"{idx_path} has no {os.path.basename(bin_path)} beside it"
        have = os.path.getsize(bin_path)
    except OSError as e:
        return f"{e.filename or idx_path} cannot be read ({e.strerror or e})"
    if have != need:
        state = "truncated" if have < need else "longer than its index says"
        return (f"{bin_path} holds {have} bytes, but {os.path.basename(idx_path)} describes {need} ({count} samples): "
                f"it is {state}, or the two files come from different binarizations")
    return token_range_error(idx_path, bin_path, head[17]) if head.startswith(MMAP_MAGIC) and have else None


#: fairseq's integer token type codes (``indexed_dataset._code_to_dtype``).
TOKEN_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16, 9: np.uint32,
                10: np.uint64}
#: The symbols a fairseq ``Dictionary`` holds before the entries of its file (bos, pad, eos, unk).
SPECIAL_SYMBOLS = 4


def token_range_error(idx_path: str, bin_path: str, code: int) -> Optional[str]:
    """Why the tokens of ``bin_path`` do not fit the dictionary the split is read with (``dict.LANG.txt`` of a
    ``SPLIT.SRC-TGT.LANG`` file, else ``dict.txt``, beside it): an id at or beyond its size, which fairseq meets as
    an ``IndexError`` inside the phase or training; None where they fit or no dictionary is found."""
    folder, parts = os.path.dirname(idx_path), os.path.basename(idx_path)[: -len(".idx")].split(".")
    dictionary = os.path.join(folder, f"dict.{parts[-1]}.txt" if len(parts) >= 3 else "dict.txt")
    if code not in TOKEN_DTYPES or not os.path.isfile(dictionary):
        return None
    with open(dictionary, "rb") as f:
        entries = sum(1 for _ in f)
    top = int(np.memmap(bin_path, dtype=TOKEN_DTYPES[code], mode="r").max())
    size = SPECIAL_SYMBOLS + entries
    if top < size:
        return None
    return (f"{bin_path} holds the token id {top}, but {dictionary} gives only {size} ids ({entries} entries and "
            f"{SPECIAL_SYMBOLS} special symbols): it is not the dictionary the split was binarized with")


def split_index_files(folder: str, split: str, *, shards: bool) -> Iterator[str]:
    """The ``.idx`` files of the split ``split`` in ``folder`` and its subfolders, as fairseq's tasks name
    them (``train.idx``, ``train.de-en.de.idx``, ``input0/train.idx``); with ``shards``, also those of
    the shards a combined load reads (``train1...``)."""
    digits = r"\d*" if shards else ""
    name = re.compile(re.escape(split) + digits + r"(\..+)?\.idx")
    for root, subfolders, files in os.walk(folder):
        for file in sorted(files):
            if name.fullmatch(file):
                yield os.path.join(root, file)
        if root != folder:
            subfolders[:] = []
        else:
            subfolders.sort()


def data_bin_error(data: str, splits: Sequence[str], *, shards: Sequence[str] = ()) -> Optional[str]:
    """The first :func:`binarized_pair_error` of the splits ``splits`` in the data-bin(s) ``data``
    (folders joined with ``os.pathsep``, as fairseq takes them; the splits in ``shards`` with their
    shards), or None."""
    for folder in str(data).split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for split in splits:
            for path in split_index_files(folder, split, shards=split in shards):
                error = binarized_pair_error(path)
                if error:
                    return error
    return None
