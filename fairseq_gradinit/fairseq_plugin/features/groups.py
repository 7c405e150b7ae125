"""Grouping of Transformer parameter names for the scale summary."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_ATTN = re.compile(r"(self_attn|encoder_attn)\.(q|k|v|out)_proj\.(weight|bias)$")
_OMEGA = re.compile(r"\.omega_(self_attn|encoder_attn|ffn)$")


def transformer_group(name: str) -> str:
    """A readable group for a fairseq Transformer parameter name, e.g. ``encoder.self_attn.q``."""
    side = name.split(".", 1)[0] if name.startswith(("encoder.", "decoder.")) else "model"
    m = _OMEGA.search(name)
    if m:  # transformer_wskip's residual scales, e.g. decoder.omega.encoder_attn
        return f"{side}.omega.{m.group(1)}"
    if name.endswith(".bias") and "layer_norm" not in name and "layernorm" not in name:
        m = _ATTN.search(name)
        return f"{side}.bias.{m.group(1)}.{m.group(2)}" if m else f"{side}.bias"
    if "embed_tokens" in name or "embed_positions" in name:
        return f"{side}.embeddings"
    if "output_projection" in name:
        return f"{side}.output_projection"
    m = _ATTN.search(name)
    if m:
        return f"{side}.{m.group(1)}.{m.group(2)}"
    if re.search(r"\.fc[12]\.", name):
        return f"{side}.ffn.{re.search(r'fc[12]', name).group(0)}"
    if "layer_norm" in name or "layernorm" in name:
        return f"{side}.layer_norm"
    return f"{side}.other"


# --------------------------------------------------------------------------------------------
# Location of a tensor (side x layer x kind), for per-layer reports
# --------------------------------------------------------------------------------------------

_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.+)\.([^.]+)$")
_LAYER_PARAM = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.([^.]+)$")
_TOP = re.compile(r"^(encoder|decoder)\.(.+)\.([^.]+)$")
_PROJ = re.compile(r"^(self_attn|encoder_attn)\.(q|k|v|out)_proj$")


@dataclass(frozen=True)
class TensorPlace:
    """Where a fairseq Transformer parameter sits: ``side`` (encoder/decoder/model), ``layer`` (block
    index, ``None`` outside the blocks), ``kind`` (e.g. ``self_attn.q``, ``fc1``, ``final_layer_norm``,
    ``embed_tokens``) and ``param`` (the attribute: ``weight``, ``bias``, ...)."""

    side: str
    layer: Optional[int]
    kind: str
    param: str


def transformer_place(name: str) -> TensorPlace:
    """The :class:`TensorPlace` of a fairseq Transformer parameter name, e.g.
    ``decoder.layers.3.encoder_attn.v_proj.weight`` -> (decoder, 3, encoder_attn.v, weight)."""
    m = _LAYER_PARAM.match(name)
    if m:  # a parameter of the block itself, e.g. transformer_wskip's decoder.layers.0.omega_self_attn
        return TensorPlace(m.group(1), int(m.group(2)), m.group(3), "parameter")
    m = _LAYER.match(name)
    if m:
        side, layer, module, param = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        p = _PROJ.match(module)
        return TensorPlace(side, layer, f"{p.group(1)}.{p.group(2)}" if p else module, param)
    m = _TOP.match(name)
    if m:
        return TensorPlace(m.group(1), None, m.group(2), m.group(3))
    module, _, param = name.rpartition(".")
    return TensorPlace("model", None, module or name, param if module else "")
