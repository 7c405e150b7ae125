"""The arithmetic of GradInit's loss passes: fp32, TF32 matmuls, or bfloat16 autocast.

Only the passes through the model change. The scales, their Adam, the writes of alpha*W, the
gradients (autograd returns them in the fp32 dtype of the parameters) and the norms of the
gradient and of the constraint stay fp32.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, List, Tuple

import torch

from .config import PRECISIONS
from .runtime import LossFn


def _tf32_settings() -> List[Tuple[object, str, object]]:
    """(owner, attribute, TF32 value) of the settings that let fp32 CUDA matmuls and cuDNN
    convolutions use TF32, in the API this torch has (mixing its two APIs is an error)."""
    matmul = torch.backends.cuda.matmul
    conv = getattr(torch.backends.cudnn, "conv", None)
    if hasattr(matmul, "fp32_precision") and conv is not None and hasattr(conv, "fp32_precision"):
        return [(matmul, "fp32_precision", "tf32"), (conv, "fp32_precision", "tf32")]
    return [(matmul, "allow_tf32", True), (torch.backends.cudnn, "allow_tf32", True)]


@contextlib.contextmanager
def tf32_matmuls() -> Iterator[None]:
    """CUDA matmuls and cuDNN convolutions of fp32 tensors in TF32 inside; the previous settings
    are restored on exit, also when an exception leaves. CPU arithmetic is not affected."""
    settings = _tf32_settings()
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in settings]
    try:
        for owner, name, value in settings:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@contextlib.contextmanager
def without_cudnn_attention() -> Iterator[None]:
    """``scaled_dot_product_attention`` without its cuDNN backend inside; the previous setting is
    restored on exit. cuDNN attention builds an execution plan for every new shape (tens of ms of
    host time per call), and GradInit's batches seldom repeat a shape; the flash and
    memory-efficient kernels that take its place need no plan."""
    enable = getattr(torch.backends.cuda, "enable_cudnn_sdp", None)
    if enable is None:  # torch without cuDNN attention
        yield
        return
    before = torch.backends.cuda.cudnn_sdp_enabled()
    enable(False)
    try:
        yield
    finally:
        enable(before)


@contextlib.contextmanager
def phase_precision(precision: str) -> Iterator[None]:
    """The context an iteration runs in: :func:`without_cudnn_attention`, and :func:`tf32_matmuls`
    for ``"tf32"``."""
    check_precision_name(precision)
    with without_cudnn_attention(), tf32_matmuls() if precision == "tf32" else contextlib.nullcontext():
        yield


def check_precision_name(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is invalid: expected one of {PRECISIONS}")


def autocast_available(device_type: str) -> bool:
    check = getattr(getattr(torch, "amp", None), "is_autocast_available", None)
    if check is not None:
        return bool(check(device_type))
    return device_type in ("cuda", "cpu")


def loss_in_precision(loss_fn: LossFn, precision: str, device_type: str) -> LossFn:
    """``loss_fn`` whose forward pass runs in ``precision`` on ``device_type`` (bf16: under
    ``torch.autocast``; the loss is returned as fp32). Autograd runs each backward op in the dtype
    of its forward op, so the backward and double backward passes follow without autocast."""
    check_precision_name(precision)
    if precision != "bf16":
        return loss_fn
    if not autocast_available(device_type):
        raise ValueError(f"precision='bf16' needs torch.autocast on {device_type!r}, which this torch does not "
                         "offer; use precision='fp32' (or 'tf32' on CUDA)")

    def bf16_loss(model, batch):
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            loss = loss_fn(model, batch)
        half = isinstance(loss, torch.Tensor) and loss.dtype in (torch.bfloat16, torch.float16)
        return loss.float() if half else loss

    bf16_loss.__wrapped__ = loss_fn  # type: ignore[attr-defined]
    return bf16_loss

