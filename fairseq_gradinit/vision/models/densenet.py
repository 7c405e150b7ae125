"""DenseNet-BC (Huang et al., 2017) for CIFAR: bottleneck layers and compression 0.5.

DenseNet-100 (k = 12): three dense blocks of 16 bottleneck layers (BN-ReLU-conv1x1 to 4k channels,
BN-ReLU-conv3x3 to k channels), a 3x3 stem convolution with 2k channels, transitions
(BN-ReLU-conv1x1-avgpool) halving the channels, and a final BN-ReLU-pool-linear head. Without BN,
every convolution has a bias instead.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .layers import channels, check_common, init_model_, norm2d
from .registry import register_model


class DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int, bn_size: int, bn: bool):
        super().__init__()
        self.norm1 = norm2d(c_in, bn)
        self.conv1 = nn.Conv2d(c_in, bn_size * growth, 1, bias=not bn)
        self.norm2 = norm2d(bn_size * growth, bn)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=not bn)

    def forward(self, features: List[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        x = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    def __init__(self, num_layers: int, c_in: int, growth: int, bn_size: int, bn: bool):
        super().__init__()
        for i in range(num_layers):
            self[f"denselayer{i + 1}"] = DenseLayer(c_in + i * growth, growth, bn_size, bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Module):
    def __init__(self, c_in: int, c_out: int, bn: bool):
        super().__init__()
        self.norm = norm2d(c_in, bn)
        self.conv = nn.Conv2d(c_in, c_out, 1, bias=not bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(self.conv(F.relu(self.norm(x))), 2)


class DenseNetBC(nn.Module):
    def __init__(self, growth_rate: int = 12, block_config: Sequence[int] = (16, 16, 16), *,
                 compression: float = 0.5, bn_size: int = 4, num_classes: int = 10, in_channels: int = 3,
                 bn: bool = True, width: float = 1.0, init: str = "kaiming"):
        super().__init__()
        check_common(num_classes, in_channels, init)
        if not 0 < compression <= 1:
            raise ValueError(f"compression={compression!r} is invalid: expected a number in (0, 1]")
        self.bn = bool(bn)
        k = channels(growth_rate, width)
        c = 2 * k
        feats = OrderedDict(conv0=nn.Conv2d(in_channels, c, 3, padding=1, bias=not self.bn))
        for i, n in enumerate(block_config):
            feats[f"denseblock{i + 1}"] = DenseBlock(n, c, k, bn_size, self.bn)
            c = c + n * k
            if i != len(block_config) - 1:
                c_out = max(1, int(c * compression))
                feats[f"transition{i + 1}"] = Transition(c, c_out, self.bn)
                c = c_out
        feats["norm_final"] = norm2d(c, self.bn)
        self.features = nn.Sequential(feats)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c, num_classes)
        init_model_(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.features(x))
        return self.classifier(torch.flatten(self.pool(x), 1))


@register_model
def densenet100(*, num_classes: int = 10, in_channels: int = 3, bn: bool = True, width: float = 1.0,
                init: str = "kaiming") -> DenseNetBC:
    """DenseNet-BC-100 (k = 12). 0.77M parameters with BN, 0.75M without (conv biases)."""
    return DenseNetBC(12, (16, 16, 16), num_classes=num_classes, in_channels=in_channels, bn=bn,
                      width=width, init=init)
