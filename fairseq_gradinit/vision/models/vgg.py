"""VGG-19 for CIFAR: the sixteen 3x3 convolutions of VGG-19 and a single fully connected layer."""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence, Union

import torch
from torch import nn

from .layers import channels, check_common, init_model_
from .registry import register_model

VGG19_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
             512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


class CifarVGG(nn.Module):
    """VGG with BN (conv -> BN -> ReLU, convolutions without bias) or without BN (conv with a
    learnable bias -> ReLU), max pooling and one linear classifier.

    Max pooling uses ``ceil_mode`` so 28x28 inputs (Fashion-MNIST) work; on 32x32 inputs this is
    the usual CIFAR VGG (32 -> 1 after five poolings).
    """

    def __init__(self, cfg: Sequence[Union[int, str]] = VGG19_CFG, *, num_classes: int = 10,
                 in_channels: int = 3, bn: bool = True, width: float = 1.0, init: str = "kaiming"):
        super().__init__()
        check_common(num_classes, in_channels, init)
        self.bn = bool(bn)
        layers = OrderedDict()
        c_in, i, p = in_channels, 0, 0
        for v in cfg:
            if v == "M":
                layers[f"pool{p}"] = nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True)
                p += 1
                continue
            c = channels(int(v), width)
            layers[f"conv{i}"] = nn.Conv2d(c_in, c, kernel_size=3, padding=1, bias=not self.bn)
            if self.bn:
                layers[f"bn{i}"] = nn.BatchNorm2d(c)
            layers[f"relu{i}"] = nn.ReLU(inplace=True)
            c_in, i = c, i + 1
        self.features = nn.Sequential(layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c_in, num_classes)
        init_model_(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


@register_model
def vgg19(*, num_classes: int = 10, in_channels: int = 3, bn: bool = True, width: float = 1.0,
          init: str = "kaiming") -> CifarVGG:
    """VGG-19 (CIFAR variant). 20.04M parameters with BN, 20.03M without (biases instead of BN)."""
    return CifarVGG(VGG19_CFG, num_classes=num_classes, in_channels=in_channels, bn=bn, width=width, init=init)
