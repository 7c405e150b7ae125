"""What the training monitor measures inside fairseq's Transformer layers on its fixed batch.

- Self-attention (:func:`recording_attention`): from each self-attention's own inputs and
  projections, the attention logits q·k/√d per head, with its masks; the largest logit and the mean
  entropy of the attention distributions (nats, over heads and the real query positions). Computed
  beside the model's own attention, whatever kernel that uses.
- Residual branches (:func:`recording_branches`): at each ``residual_connection(x, residual)`` of a
  fairseq Transformer layer, ‖x‖ / ‖residual‖ over the whole batch: the size of what a branch
  (self-attention, cross-attention, feed-forward) adds against the residual stream it is added to.

Both record into a dict while their context is open, and never raise into the forward pass: a
module whose statistics fail is recorded with ``error``.
"""
from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

#: Names of a fairseq Transformer layer's residual branches, in the order its forward adds them.
ENCODER_BRANCHES = ("self_attn", "ffn")
DECODER_BRANCHES = ("self_attn", "encoder_attn", "ffn")


def is_self_attention(module: nn.Module) -> bool:
    """fairseq's MultiheadAttention used as self-attention (its ``self_attention`` flag)."""
    return bool(getattr(module, "self_attention", False)) and all(
        hasattr(module, a) for a in ("q_proj", "k_proj", "num_heads", "head_dim"))


def attention_logits(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                     key_padding_mask: Optional[torch.Tensor], attn_mask: Optional[torch.Tensor]):
    """``(logits, valid, rows)``: the scaled logits of fairseq's attention, (batch x heads, tgt, src)
    in fp32, where a key is visible to a query (masks applied), and which query rows are real
    positions (self-attention: not padding). Inputs are time-first, as fairseq's."""
    tgt, bsz, _ = query.shape
    src = key.shape[0]
    heads, dim = module.num_heads, module.head_dim
    scaling = getattr(module, "scaling", dim ** -0.5)
    q = F.linear(query.float(), module.q_proj.weight.float(),
                 None if module.q_proj.bias is None else module.q_proj.bias.float()) * scaling
    k = F.linear(key.float(), module.k_proj.weight.float(),
                 None if module.k_proj.bias is None else module.k_proj.bias.float())
    q = q.reshape(tgt, bsz * heads, dim).transpose(0, 1)
    k = k.reshape(src, bsz * heads, dim).transpose(0, 1)
    logits = torch.bmm(q, k.transpose(1, 2))
    valid = torch.ones_like(logits, dtype=torch.bool)
    if attn_mask is not None:
        mask = attn_mask if attn_mask.dtype == torch.bool else ~torch.isfinite(attn_mask.float())
        if attn_mask.dtype != torch.bool:
            logits = logits + torch.nan_to_num(attn_mask.float(), neginf=0.0).reshape(-1, tgt, src)
        valid &= ~mask.reshape(-1, tgt, src)
    rows = torch.ones(bsz * heads, tgt, dtype=torch.bool, device=logits.device)
    if key_padding_mask is not None:
        pad = key_padding_mask.to(torch.bool).reshape(bsz, 1, src).expand(bsz, heads, src).reshape(bsz * heads, src)
        valid &= ~pad.unsqueeze(1)
        if tgt == src:
            rows &= ~pad
    return logits, valid, rows


def attention_summary(logits: torch.Tensor, valid: torch.Tensor, rows: torch.Tensor) -> Dict[str, float]:
    """``max_logit`` over the visible (query, key) pairs and ``entropy``, the mean entropy (nats) of
    the attention rows of real queries that see at least one key."""
    masked = logits.masked_fill(~valid, float("-inf"))
    rows = rows & valid.any(dim=-1)
    logp = torch.log_softmax(masked, dim=-1)
    entropy = -(logp.exp() * logp.masked_fill(~valid, 0.0)).sum(-1)
    max_logit = masked.max()
    return {"entropy": float(entropy[rows].mean()) if bool(rows.any()) else math.nan,
            "max_logit": float(max_logit)}


@contextlib.contextmanager
def recording_attention(model: nn.Module) -> Iterator[Dict[str, dict]]:
    """Within the context, every forward pass of a self-attention of ``model`` records
    :func:`attention_summary` into the yielded dict, by module name (the last call is kept)."""
    out: Dict[str, dict] = {}
    handles = []

    def hook_for(name: str):
        def hook(module, args, kwargs):
            try:
                query = kwargs.get("query", args[0] if args else None)
                key = kwargs.get("key", args[1] if len(args) > 1 else None)
                key = query if key is None else key
                with torch.autocast(query.device.type, enabled=False):  # fp32, also in an AMP pass
                    out[name] = attention_summary(*attention_logits(
                        module, query.detach(), key.detach(), kwargs.get("key_padding_mask"), kwargs.get("attn_mask")))
            except Exception as e:  # a statistic must never stop the pass it watches
                out[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
        return hook

    for name, m in model.named_modules():
        if is_self_attention(m):
            handles.append(m.register_forward_pre_hook(hook_for(name), with_kwargs=True))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def recording_branches(model: nn.Module) -> Iterator[Dict[str, Dict[str, float]]]:
    """Within the context, every ``residual_connection(x, residual)`` of a fairseq Transformer layer
    of ``model`` records ‖x‖ / ‖residual‖ into the yielded dict: ``{layer: {branch: ratio}}``."""
    out: Dict[str, Dict[str, float]] = {}
    wrapped = []

    def wrapper_for(name: str, layer: nn.Module, original):
        names = DECODER_BRANCHES if getattr(layer, "encoder_attn", None) is not None else ENCODER_BRANCHES
        calls = [0]

        def residual_connection(x, residual):
            index = calls[0]
            calls[0] += 1
            branch = names[index] if index < len(names) else f"branch{index}"
            try:
                r = float(residual.detach().float().norm())
                out.setdefault(name, {})[branch] = float(x.detach().float().norm()) / r if r > 0 else math.inf
            except Exception:  # a statistic must never stop the pass it watches
                pass
            return original(x, residual)
        return residual_connection

    for name, m in model.named_modules():
        original = getattr(m, "residual_connection", None)
        if callable(original) and "residual_connection" not in vars(m):
            m.residual_connection = wrapper_for(name, m, original)
            wrapped.append(m)
    try:
        yield out
    finally:
        for m in wrapped:
            del m.residual_connection
