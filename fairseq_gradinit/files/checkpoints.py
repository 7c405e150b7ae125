"""Loading fairseq checkpoints under torch >= 2.6, in one place.

fairseq 0.12.3 calls ``torch.load`` without ``weights_only``; torch >= 2.6 defaults it to True and then
refuses fairseq's checkpoints, which pickle an ``argparse.Namespace`` or an omegaconf config. Upstream
fairseq later passed ``weights_only=False``; so does :func:`load_trusted_checkpoint`, which the plugin
gives fairseq's own checkpoint code (:mod:`fairseq_gradinit.fairseq_plugin.registration.compat`) and the BLEU tool
uses to read a checkpoint. A fairseq process started without the plugin gets the same through
:func:`trusted_loading_env`. Only load checkpoints you trust: unpickling runs code.
"""
from __future__ import annotations

from typing import Dict, Mapping


def load_trusted_checkpoint(*args, **kwargs):
    """``torch.load`` with ``weights_only=False`` unless the caller passes it."""
    import torch

    kwargs.setdefault("weights_only", False)
    return torch.load(*args, **kwargs)


def trusted_loading_env(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` for a fairseq subprocess that loads checkpoints: ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``
    unless either of torch's two variables is set already (the caller's choice wins)."""
    out = dict(env)
    if "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in out:
        out.setdefault("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    return out


def checkpoint_file_error(path) -> str | None:
    """Why the file at ``path`` is no torch checkpoint (empty, text such as a ``gradinit.json``, another kind of
    binary file, or a cut-off zip archive), or None; read from its first bytes, before fairseq loads it."""
    import zipfile

    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "is empty"
    if head == b"PK\x03\x04":  # torch.save's zip format: a cut-off file has no central directory
        try:
            with zipfile.ZipFile(path) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            return f"is truncated or damaged ({e})"
        return None
    if head[:1] == b"\x80":  # torch's legacy format: a pickle (protocol >= 2)
        return None
    kind = "JSON" if head.lstrip()[:1] in (b"{", b"[") else "not a torch checkpoint"
    return f"is {kind}, not a checkpoint that torch.save wrote" if kind == "JSON" else f"is {kind}"
