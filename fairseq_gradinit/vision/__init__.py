"""GradInit for vision models: a one-call API and the paper's CIFAR architectures.

>>> from fairseq_gradinit.vision import create_model, gradinit
>>> model = create_model("resnet110", bn=False)
>>> result = gradinit(model, train_loader, lr=5e-2)      # SGD, eta=0.1, gamma=1 (paper's CIFAR setup)

This package never imports fairseq.
"""
from ..core import GradInitConfig, GradInitResult, MetaInitConfig, MetaInitResult, apply_scales
from ..core.sdpa_guard import guard_cudnn_sdpa
from .api import classification_loss, gradinit, metainit, model_device, to_device
from .models import create_model, list_models, register_model

__all__ = [
    "GradInitConfig", "GradInitResult", "MetaInitConfig", "MetaInitResult", "apply_scales",
    "classification_loss", "create_model", "gradinit", "guard_cudnn_sdpa", "list_models", "metainit", "model_device",
    "register_model", "to_device",
]
