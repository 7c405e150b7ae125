"""Grouping of Transformer parameter names for the scale summary."""
from __future__ import annotations

import re

_ATTN = re.compile(r"(self_attn|encoder_attn)\.(q|k|v|out)_proj\.(weight|bias)$")


def transformer_group(name: str) -> str:
    """A readable group for a fairseq Transformer parameter name, e.g. ``encoder.self_attn.q``."""
    side = name.split(".", 1)[0] if name.startswith(("encoder.", "decoder.")) else "model"
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
