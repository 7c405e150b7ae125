"""What a checkpoint about to be restored must agree with, checked before fairseq loads it.

fairseq-train loads the checkpoint after the task's ``build_criterion``; a mismatch it finds there
ends in its long "Cannot load model parameters" traceback. These checks say what to change instead.
"""
from __future__ import annotations

from typing import Optional

import torch

from .tied import multiplier_names


def _model_keys(path: str) -> set:
    try:  # memory-mapped: only the keys are needed, not the tensors
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except (RuntimeError, ValueError):  # not a zip-format checkpoint
        state = torch.load(path, map_location="cpu", weights_only=False)
    return set((state or {}).get("model") or {})


def resume_error(model, source: str) -> Optional[str]:
    """Why the checkpoint ``source`` cannot be restored into ``model`` as built with this command
    line, or None. Today: ``--gradinit-tied-embeddings per-use`` given for a checkpoint trained
    with shared scales (its state has no per-use multipliers)."""
    multipliers = multiplier_names(model)
    if not multipliers:
        return None
    keys = _model_keys(source)
    if not any(name in keys for name in multipliers):
        return (f"the checkpoint {source} was trained with shared scales of the tied embeddings (its state has no "
                f"per-use multiplier such as {multipliers[0]}): resume it without --gradinit-tied-embeddings per-use "
                "(the tying of a run is fixed when it starts)")
    return None
