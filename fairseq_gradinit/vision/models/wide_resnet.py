"""Wide ResNet (Zagoruyko & Komodakis, 2016) for CIFAR, pre-activation blocks, no dropout.

As in the GradInit authors' WRN, every convolution has a bias; this gives the paper's 36.49M
parameters for WRN-28-10.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import channels, check_common, init_model_, norm2d, residual_stages
from .registry import register_model


class WideBlock(nn.Module):
    """BN-ReLU-conv3x3-BN-ReLU-conv3x3 + shortcut (1x1 convolution when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1, bn: bool = True):
        super().__init__()
        self.bn1 = norm2d(c_in, bn)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=True)
        self.bn2 = norm2d(c_out, bn)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=True)
        self.shortcut = (nn.Conv2d(c_in, c_out, 1, stride=stride, bias=True)
                         if (stride != 1 or c_in != c_out) else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return out + self.shortcut(x)


class WideResNet(nn.Module):
    def __init__(self, depth: int = 28, widen_factor: int = 10, *, num_classes: int = 10, in_channels: int = 3,
                 bn: bool = True, width: float = 1.0, init: str = "kaiming"):
        super().__init__()
        check_common(num_classes, in_channels, init)
        if not isinstance(depth, int) or depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"depth={depth!r} is invalid for a Wide ResNet: expected 6n + 4 (e.g. 28)")
        n = (depth - 4) // 6
        self.bn = bool(bn)
        stem = channels(16, width)
        widths = [channels(c * widen_factor, width) for c in (16, 32, 64)]
        self.conv1 = nn.Conv2d(in_channels, stem, 3, padding=1, bias=True)
        (self.layer1, self.layer2, self.layer3), c_in = residual_stages(WideBlock, stem, widths, n, bn=self.bn)
        self.bn_final = norm2d(c_in, self.bn)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)
        init_model_(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.conv1(x))))
        x = F.relu(self.bn_final(x))
        return self.fc(torch.flatten(self.pool(x), 1))


@register_model
def wrn_28_10(*, num_classes: int = 10, in_channels: int = 3, bn: bool = True, width: float = 1.0,
              init: str = "kaiming") -> WideResNet:
    """WRN-28-10 (36.49M parameters with BN). ``width`` scales every channel count."""
    return WideResNet(28, 10, num_classes=num_classes, in_channels=in_channels, bn=bn, width=width, init=init)
