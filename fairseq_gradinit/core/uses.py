"""Parameter uses that keep alpha*W in GradInit's simulated step.

A tied tensor (e.g. a decoder embedding that is also the output projection) is one parameter used by
several modules. The authors' fairseq code swaps the stepped weight into every module except the
tied output projection, which keeps alpha*W; ``GradInitConfig.unstepped_uses`` names such uses.
A tensor all of whose uses match simply takes no step; a tensor with matching and other uses is
untied for the objective pass: the matching modules read a separate leaf holding alpha*W, and its
gradient is added to the tensor's, since both uses depend on alpha through W.
"""
from __future__ import annotations

import contextlib
import re
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import nn


class UnsteppedUses:
    """The uses of ``params`` (by module attribute) whose names match ``pattern``."""

    def __init__(self, model: nn.Module, params: Sequence[nn.Parameter], pattern: str):
        index = {id(p): i for i, p in enumerate(params)}
        uses: Dict[int, List[Tuple[nn.Module, str, str]]] = {}
        matched: Dict[int, List[Tuple[nn.Module, str, str]]] = {}
        regex = re.compile(pattern)
        for mod_name, module in model.named_modules(remove_duplicate=False):
            for attr, p in module._parameters.items():
                if p is None or id(p) not in index:
                    continue
                name = f"{mod_name}.{attr}" if mod_name else attr
                i = index[id(p)]
                uses.setdefault(i, []).append((module, attr, name))
                if regex.search(name):
                    matched.setdefault(i, []).append((module, attr, name))
        if not matched:
            raise ValueError(_no_match(pattern, [n for u in uses.values() for *_, n in u], "unstepped_uses="))
        #: indices of tensors that take no step at all (every use matches)
        self.whole = sorted(i for i, m in matched.items() if len({n for *_, n in m}) == len({n for *_, n in uses[i]}))
        #: (index, module, attr) of matching uses of tensors that also have stepped uses
        self.partial = [(i, mod, attr) for i, m in matched.items() if i not in self.whole
                        for mod, attr, _ in _unique(m)]
        #: the names of the matching uses, for logs and results
        self.names = sorted({n for m in matched.values() for *_, n in m})

    def drop_steps(self, direction: List[torch.Tensor]) -> None:
        """Zero the step of the tensors whose every use is un-stepped (in place)."""
        for i in self.whole:
            direction[i].zero_()

    @contextlib.contextmanager
    def untied(self, scaled_weights: Sequence[torch.Tensor]) -> Iterator[List[Tuple[int, nn.Parameter]]]:
        """Within the context the partial uses read their own leaf holding ``scaled_weights[i]``
        (alpha_i * W_i); yields ``(i, leaf)`` pairs. The modules get their tensors back on exit."""
        saved, leaves = [], []
        try:
            for i, mod, attr in self.partial:
                leaf = nn.Parameter(scaled_weights[i].detach().clone(), requires_grad=True)
                saved.append((mod, attr, mod._parameters[attr]))
                mod._parameters[attr] = leaf
                leaves.append((i, leaf))
            yield leaves
        finally:
            for mod, attr, p in reversed(saved):
                mod._parameters[attr] = p


def use_names(model: nn.Module, params: Optional[Sequence[nn.Parameter]] = None) -> List[str]:
    """The name of every use of ``params`` (default: the trainable parameters) by a module attribute,
    as :class:`UnsteppedUses` matches them: tied tensors first (the uses a pattern is meant for)."""
    wanted = {id(p) for p in (params if params is not None else model.parameters()) if p.requires_grad}
    uses: Dict[int, List[str]] = {}
    for mod_name, module in model.named_modules(remove_duplicate=False):
        for attr, p in module._parameters.items():
            if p is not None and id(p) in wanted:
                uses.setdefault(id(p), []).append(f"{mod_name}.{attr}" if mod_name else attr)
    tied = [n for names in uses.values() if len(names) > 1 for n in names]
    return tied + [n for names in uses.values() if len(names) == 1 for n in names]


def unstepped_uses_error(model: nn.Module, pattern: Optional[str], *, label: str = "unstepped_uses=") -> Optional[str]:
    """Why ``pattern`` cannot name un-stepped uses of ``model``'s trainable parameters (it matches none
    of them, listing some it could match), or None; checked before the long work, once the model exists."""
    if not pattern:
        return None
    names = use_names(model)
    regex = re.compile(pattern)
    return None if any(regex.search(n) for n in names) else _no_match(pattern, names, label)


def _no_match(pattern: str, names: Sequence[str], label: str) -> str:
    return (f"{label}{pattern!r} matches no use of a parameter that GradInit steps; give a regular expression "
            f"(searched in each name) on the names of the uses, which here are e.g. {list(names[:6])}; the "
            "authors' tied output projection is 'decoder\\.output_projection\\.'")


def _unique(uses):
    seen, out = set(), []
    for mod, attr, name in uses:
        if (id(mod), attr) not in seen:
            seen.add((id(mod), attr))
            out.append((mod, attr, name))
    return out
