"""Per-use GradInit scales for tied embeddings (``--gradinit-tied-embeddings per-use``).

A tied embedding matrix W is used in several places: the encoder input, the decoder input and the
output projection under ``--share-all-embeddings``; the decoder input and the output projection
under ``--share-decoder-input-output-embed``. With one scale per tensor, GradInit must give all uses
the same factor. ``per-use`` keeps W tied (one Parameter, scaled by the output projection's use)
and turns fairseq's ``embed_scale`` of each encoder/decoder whose input embedding is tied into a
0-d buffer, ``<module>.embed_scale``: a multiplier that fairseq already applies to that use. During
GradInit the multipliers are parameters with a scale each that are left out of g and the simulated
step (``GradInitConfig.fixed_params``: training does not update them), so dL/d(scale of a use) is
exact: <dL/dm, m> of that use's multiplier. Being buffers, they are saved in checkpoints, and the
model built when a checkpoint is loaded (resume, fairseq-generate) gets the same buffers, because
the task builds them whenever its config says ``per-use``.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Dict, Iterator, List, Mapping, Tuple

import torch
from torch import nn

logger = logging.getLogger(__name__)

MODES = ("shared", "per-use")
MULTIPLIER = "embed_scale"


def _embedding_owners(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, module) of the encoders/decoders that scale their input embedding by ``embed_scale``."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(getattr(m, "embed_tokens", None), nn.Embedding) and hasattr(m, MULTIPLIER)]


def _qualified(owner_name: str) -> str:
    return f"{owner_name}.{MULTIPLIER}" if owner_name else MULTIPLIER


def _make_buffer(owner: nn.Module) -> None:
    """``owner.embed_scale`` (a Python float) as a 0-d buffer of the same value."""
    value = float(getattr(owner, MULTIPLIER))
    delattr(owner, MULTIPLIER)
    owner.register_buffer(MULTIPLIER, torch.tensor(value, dtype=owner.embed_tokens.weight.dtype))


def _uses_per_weight(model: nn.Module) -> Dict[int, int]:
    """How many modules use each embedding-like weight (input embeddings and output projections)."""
    seen: Dict[int, set] = {}
    for name, m in model.named_modules():
        for attr in ("embed_tokens", "output_projection"):
            sub = getattr(m, attr, None)
            w = getattr(sub, "weight", None)
            if isinstance(w, nn.Parameter):
                seen.setdefault(id(w), set()).add(f"{name}.{attr}")
    return {k: len(v) for k, v in seen.items()}


def install_multipliers(model: nn.Module) -> List[str]:
    """Turn ``embed_scale`` of every encoder/decoder whose input embedding is tied into a 0-d buffer
    (same value, so the model computes the same function). Returns the buffer names."""
    uses = _uses_per_weight(model)
    names = []
    for name, owner in _embedding_owners(model):
        if uses.get(id(owner.embed_tokens.weight), 0) < 2 or isinstance(getattr(owner, MULTIPLIER), torch.Tensor):
            continue
        _make_buffer(owner)
        names.append(_qualified(name))
    return names


def install_multipliers_on_load(model: nn.Module) -> None:
    """Make ``model.load_state_dict`` install the multipliers a state holds (a checkpoint of a
    per-use run). fairseq-generate builds the model with its own command line's task, whose
    ``--gradinit-tied-embeddings`` is the default, so the task's config alone cannot tell."""

    def hook(module, state_dict, prefix, *args):
        for name, owner in _embedding_owners(module):
            if prefix + _qualified(name) in state_dict and not isinstance(getattr(owner, MULTIPLIER), torch.Tensor):
                _make_buffer(owner)

    model.register_load_state_dict_pre_hook(hook)


def multiplier_names(model: nn.Module) -> List[str]:
    """The per-use multipliers the model holds (installed by :func:`install_multipliers`)."""
    return [_qualified(name) for name, owner in _embedding_owners(model)
            if isinstance(getattr(owner, MULTIPLIER), torch.Tensor)]


@contextlib.contextmanager
def multipliers_as_parameters(model: nn.Module, names: List[str]) -> Iterator[None]:
    """Inside: the multipliers are trainable parameters (GradInit gives them a scale). After, also
    on error: buffers again, holding their values then (GradInit leaves alpha * m in them)."""
    owners = {_qualified(n): m for n, m in _embedding_owners(model)}
    for name in names:
        owner = owners[name]
        value = owner._buffers.pop(MULTIPLIER)
        owner.register_parameter(MULTIPLIER, nn.Parameter(value.detach().clone()))
    try:
        yield
    finally:
        for name in names:
            owner = owners[name]
            value = owner._parameters.pop(MULTIPLIER)
            owner.register_buffer(MULTIPLIER, value.detach().clone())


def is_multiplier(name: str, param=None) -> bool:
    """Whether ``name`` is a per-use multiplier (usable as ``GradInitConfig.fixed_params``)."""
    return name == MULTIPLIER or name.endswith("." + MULTIPLIER)


@torch.no_grad()
def apply_multiplier_scales(model: nn.Module, scales: Mapping[str, float]) -> Dict[str, float]:
    """Multiply the multipliers named in ``scales`` by their scale; returns the other scales."""
    buffers = dict(model.named_buffers())
    rest = {}
    for name, value in scales.items():
        if is_multiplier(name):
            if name not in buffers:
                raise ValueError(f"{name}: a per-use scale of tied embeddings, but this model has no such "
                                 "multiplier; the scales were computed with --gradinit-tied-embeddings per-use")
            buffers[name].mul_(float(value))
        else:
            rest[name] = value
    return rest


def effective_use_scales(model: nn.Module, scales: Mapping[str, float]) -> Dict[str, float]:
    """The factor GradInit gave each use of a tied embedding matrix: the tensor's own scale times the
    use's multiplier scale (input embeddings), or the tensor's own scale (output projection)."""
    by_weight: Dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in scales:
            by_weight.setdefault(id(p), name)
    out = {}
    for name, m in model.named_modules():
        for attr in ("embed_tokens", "output_projection"):
            w = getattr(getattr(m, attr, None), "weight", None)
            if not isinstance(w, nn.Parameter) or id(w) not in by_weight:
                continue
            use = f"{name}.{attr}" if name else attr
            factor = float(scales[by_weight[id(w)]])
            mult = _qualified(name)
            if attr == "embed_tokens" and mult in scales:
                factor *= float(scales[mult])
            out[use] = factor
    return out


def uncovered_ties(model: nn.Module) -> List[List[str]]:
    """Names of each tensor the model uses under several names (a tie) that no per-use multiplier
    covers: ties other than an ``embed_tokens`` with fairseq's ``embed_scale`` (e.g. RoBERTa's
    output head, an LSTM's shared embeddings), which ``per-use`` would leave shared without a word."""
    covered = {id(owner.embed_tokens.weight) for _, owner in _embedding_owners(model)
               if isinstance(getattr(owner, MULTIPLIER), torch.Tensor)}
    groups: Dict[int, List[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    # A decoder that reuses its embedding as the output projection inside its forward (fairseq's LSTM
    # decoder with --share-decoder-input-output-embed) ties one tensor under one name: its flag says so.
    for name, m in model.named_modules():
        w = getattr(getattr(m, "embed_tokens", None), "weight", None)
        if getattr(m, "share_input_output_embed", False) is True and isinstance(w, nn.Parameter) \
                and id(w) not in covered and len(groups.get(id(w), ())) == 1:
            weight = f"{name}.embed_tokens.weight" if name else "embed_tokens.weight"
            groups[id(w)] = [weight, f"{weight} as its output projection"]
    return [names for key, names in groups.items() if len(names) > 1 and key not in covered]
