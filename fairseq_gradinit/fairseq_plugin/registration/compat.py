"""Compatibility fixes applied when the plugin is loaded."""
from __future__ import annotations

import inspect
import logging
import types

import torch

from ...files.checkpoints import load_trusted_checkpoint

logger = logging.getLogger(__name__)


class _TorchWithPickleLoad(types.ModuleType):
    """``torch`` as seen by fairseq's checkpoint code: ``torch.load`` is
    :func:`~fairseq_gradinit.files.checkpoints.load_trusted_checkpoint` (weights_only=False by default), for
    fairseq's own modules only, leaving ``torch.load`` unchanged for everybody else."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    load = staticmethod(load_trusted_checkpoint)


def patch_fairseq_checkpoint_loading() -> None:
    """Let fairseq load its own (trusted) checkpoints on torch >= 2.6."""
    import fairseq.checkpoint_utils as checkpoint_utils
    import fairseq.distributed.utils as dist_utils

    for mod in (checkpoint_utils, dist_utils):
        if not isinstance(getattr(mod, "torch", None), _TorchWithPickleLoad):
            mod.torch = _TorchWithPickleLoad()


def checkpoint_loading_patched() -> bool:
    """Whether :func:`patch_fairseq_checkpoint_loading` is in effect."""
    import fairseq.checkpoint_utils as checkpoint_utils

    return isinstance(getattr(checkpoint_utils, "torch", None), _TorchWithPickleLoad)


def takes_keyword(fn, name: str) -> bool:
    """Whether calling ``fn`` with the keyword ``name`` is allowed (fairseq asks this of a task's
    ``build_model`` before passing ``from_checkpoint``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class _NumpyWithCompat(types.ModuleType):
    """``numpy`` as seen by the fairseq modules that still spell ``np.compat.long``, which numpy 2
    removed (``--sample-break-mode eos``, bucketed batches): ``np.compat.long`` is numpy 1's ``int``."""

    compat = types.SimpleNamespace(long=int)

    def __init__(self):
        super().__init__("numpy")

    def __getattr__(self, name):
        import numpy

        return getattr(numpy, name)


#: fairseq modules that use ``np.compat`` (fairseq 0.12.3).
NUMPY_COMPAT_USERS = ("fairseq.data.token_block_dataset", "fairseq.data.language_pair_dataset")


def patch_fairseq_numpy_compat() -> None:
    """Let fairseq's modules that use ``np.compat.long`` run on numpy >= 2 (only theirs: numpy itself
    is left unchanged for everybody else)."""
    import importlib

    import numpy

    if hasattr(numpy, "compat"):
        return
    for name in NUMPY_COMPAT_USERS:
        mod = importlib.import_module(name)
        if getattr(mod, "np", None) is numpy:
            mod.np = _NumpyWithCompat()


def numpy_compat_patched() -> bool:
    """Whether :func:`patch_fairseq_numpy_compat` is in effect."""
    import sys

    return any(isinstance(getattr(sys.modules.get(name), "np", None), _NumpyWithCompat) for name in NUMPY_COMPAT_USERS)
