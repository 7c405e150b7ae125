"""CIFAR ResNets (He et al., 2016) with and without BN, and FixUpResNet (Zhang et al., 2019).

Base width 16 (stages of 16, 32 and 64 channels), two 3x3 convolutions per residual block,
depth = 6n + 2. The shortcut of a block that changes the shape subsamples its input with stride 2
(a 1x1 average pooling) and pads the missing channels with zeros (no parameters; with BN, a BN
layer follows the subsampling as in the GradInit authors' networks).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import channels, check_common, init_model_, norm2d, residual_stages
from .registry import register_model


def _stage_blocks(depth: int) -> int:
    if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6 != 0:
        raise ValueError(f"depth={depth!r} is invalid for a CIFAR ResNet: expected 6n + 2 with n >= 1 (e.g. 110, 1202)")
    return (depth - 2) // 6


def _pad_channels(x: torch.Tensor, c_out: int) -> torch.Tensor:
    extra = c_out - x.shape[1]
    return F.pad(x, (0, 0, 0, 0, 0, extra)) if extra > 0 else x


class PadShortcut(nn.Module):
    """Option-A shortcut: subsample by ``stride``, optional BN, zero-pad channels to ``c_out``."""

    def __init__(self, c_in: int, c_out: int, stride: int, bn: bool):
        super().__init__()
        self.stride, self.c_out = stride, c_out
        self.bn = norm2d(c_in, bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride > 1:
            x = x[:, :, ::self.stride, ::self.stride]
        return _pad_channels(self.bn(x), self.c_out)


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN + shortcut, ReLU. Without BN the convolutions have biases."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1, bn: bool = True):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=not bn)
        self.bn1 = norm2d(c_out, bn)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=not bn)
        self.bn2 = norm2d(c_out, bn)
        self.shortcut = PadShortcut(c_in, c_out, stride, bn) if (stride != 1 or c_in != c_out) else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    def __init__(self, depth: int = 110, *, num_classes: int = 10, in_channels: int = 3, bn: bool = True,
                 width: float = 1.0, init: str = "kaiming"):
        super().__init__()
        check_common(num_classes, in_channels, init)
        n = _stage_blocks(depth)
        self.bn = bool(bn)
        widths = [channels(c, width) for c in (16, 32, 64)]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=not self.bn)
        self.bn1 = norm2d(widths[0], self.bn)
        (self.layer1, self.layer2, self.layer3), c_in = residual_stages(BasicBlock, widths[0], widths, n, bn=self.bn)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)
        init_model_(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class FixupBlock(nn.Module):
    """FixUp residual block: scalar biases before each convolution and activation, and a scalar
    multiplier after the second convolution; no normalization."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.bias1a = nn.Parameter(torch.zeros(1))
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bias1b = nn.Parameter(torch.zeros(1))
        self.bias2a = nn.Parameter(torch.zeros(1))
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.scale = nn.Parameter(torch.ones(1))
        self.bias2b = nn.Parameter(torch.zeros(1))
        self.stride, self.c_out = stride, c_out
        self.reshape = stride != 1 or c_in != c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_b = x + self.bias1a
        out = F.relu(self.conv1(x_b) + self.bias1b)
        out = self.conv2(out + self.bias2a) * self.scale + self.bias2b
        if self.reshape:
            identity = _pad_channels(x_b[:, :, ::self.stride, ::self.stride], self.c_out)
        else:
            identity = x
        return F.relu(out + identity)


class FixupResNet(nn.Module):
    """FixUpResNet for CIFAR. ``fixup_init=True``: FixUp's initialization (first convolution of
    each block Kaiming-normal scaled by L^(-1/2) for L residual blocks, second convolution and the
    classifier at zero). ``fixup_init=False``: Kaiming initialization of every convolution and of
    the classifier (non-zero), the starting point the paper uses for GradInit on this network."""

    def __init__(self, depth: int = 110, *, num_classes: int = 10, in_channels: int = 3,
                 width: float = 1.0, fixup_init: bool = True):
        super().__init__()
        check_common(num_classes, in_channels, "kaiming")
        n = _stage_blocks(depth)
        widths = [channels(c, width) for c in (16, 32, 64)]
        self.num_blocks = 3 * n
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.bias1 = nn.Parameter(torch.zeros(1))
        c_in, stages = widths[0], []
        for i, c in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(FixupBlock(c_in, c, stride=2 if (i > 0 and j == 0) else 1))
                c_in = c
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.bias2 = nn.Parameter(torch.zeros(1))
        self.fc = nn.Linear(c_in, num_classes)
        self.fixup_init = bool(fixup_init)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        self.fc.reset_parameters()
        nn.init.zeros_(self.fc.bias)
        for name, p in self.named_parameters():
            if name.endswith("scale"):
                p.fill_(1.0)
            elif name.split(".")[-1].startswith("bias") and p.dim() == 1 and p.numel() == 1:
                p.zero_()
        if self.fixup_init:
            factor = self.num_blocks ** -0.5
            for m in self.modules():
                if isinstance(m, FixupBlock):
                    m.conv1.weight.mul_(factor)
                    nn.init.zeros_(m.conv2.weight)
            nn.init.zeros_(self.fc.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x) + self.bias1)
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.pool(x), 1) + self.bias2)


@register_model
def resnet110(*, num_classes: int = 10, in_channels: int = 3, bn: bool = True, width: float = 1.0,
              init: str = "kaiming") -> CifarResNet:
    """ResNet-110 (18 blocks per stage). 1.73M parameters with BN, 1.72M without (conv biases)."""
    return CifarResNet(110, num_classes=num_classes, in_channels=in_channels, bn=bn, width=width, init=init)


@register_model
def resnet1202(*, num_classes: int = 10, in_channels: int = 3, bn: bool = True, width: float = 1.0,
               init: str = "kaiming") -> CifarResNet:
    """ResNet-1202 (200 blocks per stage). 19.42M parameters with BN."""
    return CifarResNet(1202, num_classes=num_classes, in_channels=in_channels, bn=bn, width=width, init=init)


@register_model
def fixup_resnet110(*, num_classes: int = 10, in_channels: int = 3, width: float = 1.0, fixup_init: bool = True,
                    bn: bool = False) -> FixupResNet:
    """FixUpResNet-110 (1.72M parameters). ``fixup_init=False`` gives the Kaiming start used for
    GradInit. The network has no BN; ``bn=True`` is rejected."""
    if bn:
        raise ValueError("fixup_resnet110 has no BN layers (FixUp replaces them); use bn=False")
    return FixupResNet(110, num_classes=num_classes, in_channels=in_channels, width=width, fixup_init=fixup_init)
