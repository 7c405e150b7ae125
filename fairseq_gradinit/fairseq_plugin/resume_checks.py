"""What a checkpoint about to be restored must agree with, checked before fairseq loads it.

fairseq-train loads the checkpoint after the task's ``build_criterion``; a mismatch it finds there
ends in its long "Cannot load model parameters" traceback. These checks say what to change instead.
"""
from __future__ import annotations

from typing import Optional

import torch

from .dictionaries import DICTIONARIES_KEY, dictionary_digests, dictionary_mismatch
from .tied import multiplier_names


def _load(path: str) -> dict:
    try:  # memory-mapped: the keys and the task state are needed, not the tensors
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except (RuntimeError, ValueError):  # not a zip-format checkpoint
        state = torch.load(path, map_location="cpu", weights_only=False)
    return state if isinstance(state, dict) else {}


def resume_error(model, source: str, *, task=None) -> Optional[str]:
    """Why the checkpoint ``source`` cannot be restored into ``model`` as built with this command
    line, or None: it was trained with other dictionaries than the data-bin's (``task``'s), or
    ``--gradinit-tied-embeddings per-use`` is given for a checkpoint trained with shared scales
    (its state has no per-use multipliers)."""
    try:
        state = _load(source)
    except Exception as e:  # noqa: BLE001 - empty, truncated or not a checkpoint: one line, not a traceback
        reason = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:200]  # its first sentence
        return (f"cannot resume from {source}: it is not a readable checkpoint ({type(e).__name__}: {reason}); it may "
                "be truncated (a run stopped while writing it). Move it away to resume from another checkpoint "
                "(--restore-file) or to start anew")
    if task is not None:
        data = getattr(getattr(task, "gradinit_cfg", None), "data", None) or "the data-bin"
        error = dictionary_mismatch((state.get("task_state") or {}).get(DICTIONARIES_KEY), dictionary_digests(task),
                                    data=str(data))
        if error is not None:
            return f"cannot resume from {source}: {error}"
    multipliers = multiplier_names(model)
    if not multipliers:
        return None
    keys = set(state.get("model") or {})
    if not any(name in keys for name in multipliers):
        return (f"the checkpoint {source} was trained with shared scales of the tied embeddings (its state has no "
                f"per-use multiplier such as {multipliers[0]}): resume it without --gradinit-tied-embeddings per-use "
                "(the tying of a run is fixed when it starts)")
    return None
