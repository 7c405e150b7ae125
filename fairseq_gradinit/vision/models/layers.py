"""Shared helpers of the CIFAR architectures: width scaling and weight initialization."""
from __future__ import annotations

from torch import nn

INITS = ("kaiming", "pytorch")


def channels(base: int, width: float) -> int:
    """``base`` channels scaled by the width multiplier (at least 1)."""
    if not (isinstance(width, (int, float)) and width > 0):
        raise ValueError(f"width={width!r} is invalid: expected a number > 0 (1.0 is the paper's width)")
    return max(1, int(round(base * width)))


def check_common(num_classes: int, in_channels: int, init: str) -> None:
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r} is invalid: expected an integer >= 1")
    if not isinstance(in_channels, int) or in_channels < 1:
        raise ValueError(f"in_channels={in_channels!r} is invalid: expected an integer >= 1 (3 for RGB, 1 for grey)")
    if init not in INITS:
        raise ValueError(f"init={init!r} is invalid: expected one of {INITS}")


def kaiming_init_(model: nn.Module) -> nn.Module:
    """The paper's starting point: Kaiming-normal (fan_out, ReLU) convolutions, zero biases,
    normalization layers at weight 1 / bias 0, and fully connected layers with PyTorch's
    Kaiming-uniform weights and zero biases."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
            if getattr(m, "weight", None) is not None:
                nn.init.ones_(m.weight)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            m.reset_parameters()
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


def init_model_(model: nn.Module, init: str) -> nn.Module:
    if init == "kaiming":
        kaiming_init_(model)
    return model


def norm2d(c: int, bn: bool) -> nn.Module:
    return nn.BatchNorm2d(c) if bn else nn.Identity()


def residual_stages(block, c_in: int, widths, blocks_per_stage: int, **block_kwargs):
    """Three CIFAR residual stages: ``blocks_per_stage`` blocks of ``block(c_in, c_out, stride=..., **kw)``
    per width, the first block of every stage after the first downsampling by 2. Returns
    ``(stages, c_out)``."""
    stages = []
    for i, c in enumerate(widths):
        blocks = []
        for j in range(blocks_per_stage):
            blocks.append(block(c_in, c, stride=2 if (i > 0 and j == 0) else 1, **block_kwargs))
            c_in = c
        stages.append(nn.Sequential(*blocks))
    return stages, c_in

