"""The Adam optimizer of the scale vector, shared by GradInit and MetaInit."""
from __future__ import annotations

from typing import Tuple, Union

import torch

Bound = Union[float, torch.Tensor, None]


class ScaleAdam:
    """Adam on a 1-D scale vector, clamped to ``[min_scale, max_scale]`` after every step.

    Bounds are numbers or per-scale tensors (``None``: unbounded). Every step is masked by a
    device-side ``ok`` flag, so a non-finite gradient leaves scales and moments unchanged without a
    host sync. ``config`` provides ``lr``, ``betas``, ``eps`` and ``scale_grad_clip``.
    """

    def __init__(self, alpha: torch.Tensor, config, *, min_scale: Bound = None, max_scale: Bound = None):
        self.cfg = config
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.m = torch.zeros_like(alpha)
        self.v = torch.zeros_like(alpha)
        self.step_count = torch.zeros((), dtype=alpha.dtype, device=alpha.device)

    def state_dict(self) -> dict:
        """The moments and step count (CPU copies)."""
        return {"m": self.m.detach().cpu().clone(), "v": self.v.detach().cpu().clone(),
                "step_count": self.step_count.detach().cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` if it holds another number of scales."""
        if tuple(state["m"].shape) != tuple(self.m.shape):
            raise ValueError(f"scale optimizer state for {tuple(state['m'].shape)} scales, this run has "
                             f"{tuple(self.m.shape)}: it was saved for another model or parameter selection")
        for key in ("m", "v", "step_count"):
            own = getattr(self, key)
            setattr(self, key, state[key].to(dtype=own.dtype, device=own.device).clone())

    def step(self, alpha: torch.Tensor, grad: torch.Tensor,
             ok: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The new scales (``alpha`` itself where the step is not finite) and the ``ok`` flag."""
        cfg = self.cfg
        b1, b2 = cfg.betas
        ok = ok & torch.isfinite(grad).all()
        grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
        if cfg.scale_grad_clip is not None:
            norm = grad.norm()
            grad = grad * torch.clamp(cfg.scale_grad_clip / (norm + 1e-12), max=1.0)
        t = self.step_count + 1
        m = self.m * b1 + grad * (1 - b1)
        v = self.v * b2 + grad * grad * (1 - b2)
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        new = clamp_scales(alpha - cfg.lr * m_hat / (v_hat.sqrt() + cfg.eps), self.min_scale, self.max_scale)
        ok = ok & torch.isfinite(new).all()
        self.m = torch.where(ok, m, self.m)
        self.v = torch.where(ok, v, self.v)
        self.step_count = torch.where(ok, t, self.step_count)
        return torch.where(ok, new, alpha), ok


def clamp_scales(alpha: torch.Tensor, lo: Bound, hi: Bound) -> torch.Tensor:
    """``alpha`` clamped to numbers or per-scale tensors (``None``: that side unbounded)."""
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        if lo is not None:
            alpha = torch.maximum(alpha, torch.as_tensor(lo, dtype=alpha.dtype, device=alpha.device))
        if hi is not None:
            alpha = torch.minimum(alpha, torch.as_tensor(hi, dtype=alpha.dtype, device=alpha.device))
        return alpha
    return alpha.clamp(min=lo, max=hi)

