"""A small timm-style model registry: ``register_model``, ``create_model``, ``list_models``."""
from __future__ import annotations

import fnmatch
from typing import Callable, Dict, List, Optional

from torch import nn

_MODELS: Dict[str, Callable[..., nn.Module]] = {}


def register_model(fn: Optional[Callable[..., nn.Module]] = None, *, name: Optional[str] = None):
    """Register a model builder under ``name`` (default: the function's name).

    Usable as ``@register_model`` or ``@register_model(name="my_net")``. Registering a name twice
    raises ``ValueError``.
    """
    def deco(f: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        key = name or f.__name__
        if key in _MODELS and _MODELS[key] is not f:
            raise ValueError(f"a model named {key!r} is already registered")
        _MODELS[key] = f
        return f

    return deco(fn) if fn is not None else deco


def list_models(pattern: str = "*") -> List[str]:
    """Sorted names of the registered models that match the shell-style ``pattern``."""
    return sorted(n for n in _MODELS if fnmatch.fnmatch(n, pattern))


def is_model(name: str) -> bool:
    return name in _MODELS


def model_builder(name: str) -> Callable[..., nn.Module]:
    try:
        return _MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; available: {', '.join(list_models())}") from None


def create_model(name: str, **kwargs) -> nn.Module:
    """Build the registered model ``name``; ``kwargs`` go to its builder
    (e.g. ``num_classes``, ``in_channels``, ``bn``, ``width``)."""
    return model_builder(name)(**kwargs)
