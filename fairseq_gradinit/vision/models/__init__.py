"""CIFAR architectures of the GradInit paper behind a timm-style registry.

>>> from fairseq_gradinit.vision.models import create_model, list_models
>>> model = create_model("resnet110", bn=False, num_classes=10)
"""
from . import densenet, resnet_cifar, vgg, wide_resnet  # noqa: F401  (register the models)
from .densenet import DenseNetBC
from .registry import create_model, is_model, list_models, model_builder, register_model
from .resnet_cifar import CifarResNet, FixupResNet
from .vgg import CifarVGG
from .wide_resnet import WideResNet

__all__ = [
    "CifarResNet", "CifarVGG", "DenseNetBC", "FixupResNet", "WideResNet", "create_model", "is_model",
    "list_models", "model_builder", "register_model",
]
