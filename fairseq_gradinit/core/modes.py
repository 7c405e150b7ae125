"""Putting a model into GradInit's mode and back."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module inside DataParallel / DistributedDataParallel (and fairseq's) wrappers."""
    seen = set()
    while hasattr(model, "module") and isinstance(model.module, nn.Module) and id(model) not in seen:
        seen.add(id(model))
        model = model.module
    return model


@contextlib.contextmanager
def gradinit_mode(model: nn.Module, *, dropout: bool = False) -> Iterator[nn.Module]:
    """Eval mode (no dropout; with ``dropout``, train mode), but normalization layers use batch statistics.

    Running statistics are neither used nor updated, and on exit every module's train/eval flag,
    ``track_running_stats`` and every normalization buffer are restored exactly.
    """
    training = [(m, m.training) for m in model.modules()]
    norms = [m for m in model.modules() if isinstance(m, _NormBase)]
    saved = [
        (m, m.track_running_stats, {k: b.detach().clone() for k, b in m.named_buffers(recurse=False)
                                    if b is not None})
        for m in norms
    ]
    model.train(dropout)
    for m in norms:
        # training=True selects batch statistics; track_running_stats=False keeps the running
        # buffers (and num_batches_tracked) out of the forward pass entirely.
        m.training = True
        m.track_running_stats = False
    try:
        yield model
    finally:
        for m, flag in training:
            m.training = flag
        with torch.no_grad():
            for m, track, buffers in saved:
                m.track_running_stats = track
                for k, b in buffers.items():
                    getattr(m, k).copy_(b)


def math_attention():
    """Context forcing PyTorch's math SDPA backend, the only one with a double backward."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    except ImportError:  # torch < 2.3
        return torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True, enable_mem_efficient=False)
