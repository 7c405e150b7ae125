"""The Adam optimizer of the scale vector, shared by GradInit and MetaInit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

Bound = Union[float, torch.Tensor, None]


@dataclass
class ScaleAdamState:
    """Adam's state for one scale vector: first and second moments and the step count (device tensors)."""

    m: torch.Tensor
    v: torch.Tensor
    step_count: torch.Tensor

    @classmethod
    def zeros_like(cls, alpha: torch.Tensor) -> "ScaleAdamState":
        """The state before the first step of ``alpha``."""
        return cls(
            torch.zeros_like(alpha), torch.zeros_like(alpha), torch.zeros((), dtype=alpha.dtype, device=alpha.device)
        )

    def state_dict(self) -> dict:
        """The moments and step count (CPU copies)."""
        return {
            "m": self.m.detach().cpu().clone(),
            "v": self.v.detach().cpu().clone(),
            "step_count": self.step_count.detach().cpu().clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` in place; ``ValueError`` if it holds another number of scales."""
        if tuple(state["m"].shape) != tuple(self.m.shape):
            raise ValueError(
                f"scale optimizer state for {tuple(state['m'].shape)} scales, this run has "
                f"{tuple(self.m.shape)}: it was saved for another model or parameter selection"
            )
        for key in ("m", "v", "step_count"):
            own = getattr(self, key)
            setattr(self, key, state[key].to(dtype=own.dtype, device=own.device).clone())


def scale_adam_step(
    alpha: torch.Tensor,
    grad: torch.Tensor,
    state: ScaleAdamState,
    *,
    lr: float,
    betas: Tuple[float, float],
    eps: float,
    clip: Optional[float],
    min_scale: Bound = None,
    max_scale: Bound = None,
    ok: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, ScaleAdamState]:
    """One Adam step of the scales ``alpha``: ``(new alpha, ok, new state)``.

    The gradient's norm is clipped to ``clip`` (``None``: no clip); the stepped scales are clamped to
    ``[min_scale, max_scale]`` (numbers or per-scale tensors, ``None``: unbounded). The step is masked by the
    device-side flag ``ok``, and-ed with the finiteness of ``grad`` and of the result: where it is false,
    ``alpha`` and ``state`` come back unchanged, with no host sync.

    ``state`` is not modified; the new state is returned. The masked update builds new tensors anyway
    (``torch.where``), so returning them costs nothing, and a pure step can be checked against a reference or
    rolled back by keeping the old state.
    """
    b1, b2 = betas
    ok = ok & torch.isfinite(grad).all()
    grad = torch.nan_to_num(grad, nan=0.0, posinf=0.0, neginf=0.0)
    if clip is not None:
        norm = grad.norm()
        grad = grad * torch.clamp(clip / (norm + 1e-12), max=1.0)
    t = state.step_count + 1
    m = state.m * b1 + grad * (1 - b1)
    v = state.v * b2 + grad * grad * (1 - b2)
    m_hat = m / (1 - b1**t)
    v_hat = v / (1 - b2**t)
    new = clamp_to_bounds(alpha - lr * m_hat / (v_hat.sqrt() + eps), min_scale, max_scale)
    ok = ok & torch.isfinite(new).all()
    kept = ScaleAdamState(
        torch.where(ok, m, state.m), torch.where(ok, v, state.v), torch.where(ok, t, state.step_count)
    )
    return torch.where(ok, new, alpha), ok, kept


class ScaleAdam:
    """Adam on a 1-D scale vector, clamped to ``[min_scale, max_scale]`` after every step: a
    :class:`ScaleAdamState` stepped by :func:`scale_adam_step` with the settings of ``config``
    (``lr``, ``betas``, ``eps``, ``scale_grad_clip``).

    Bounds are numbers or per-scale tensors (``None``: unbounded). Every step is masked by a
    device-side ``ok`` flag, so a non-finite gradient leaves scales and moments unchanged without a
    host sync.
    """

    def __init__(self, alpha: torch.Tensor, config, *, min_scale: Bound = None, max_scale: Bound = None):
        self.cfg = config
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.state = ScaleAdamState.zeros_like(alpha)

    @property
    def m(self) -> torch.Tensor:
        return self.state.m

    @property
    def v(self) -> torch.Tensor:
        return self.state.v

    @property
    def step_count(self) -> torch.Tensor:
        return self.state.step_count

    def state_dict(self) -> dict:
        """The moments and step count (CPU copies)."""
        return self.state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; ``ValueError`` if it holds another number of scales."""
        self.state.load_state_dict(state)

    def step(self, alpha: torch.Tensor, grad: torch.Tensor, ok: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The new scales (``alpha`` itself where the step is not finite) and the ``ok`` flag."""
        cfg = self.cfg
        new, ok, self.state = scale_adam_step(
            alpha,
            grad,
            self.state,
            lr=cfg.lr,
            betas=cfg.betas,
            eps=cfg.eps,
            clip=cfg.scale_grad_clip,
            min_scale=self.min_scale,
            max_scale=self.max_scale,
            ok=ok,
        )
        return new, ok


def clamp_to_bounds(alpha: torch.Tensor, lo: Bound, hi: Bound) -> torch.Tensor:
    """``alpha`` clamped to numbers or per-scale tensors (``None``: that side unbounded)."""
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        if lo is not None:
            alpha = torch.maximum(alpha, torch.as_tensor(lo, dtype=alpha.dtype, device=alpha.device))
        if hi is not None:
            alpha = torch.minimum(alpha, torch.as_tensor(hi, dtype=alpha.dtype, device=alpha.device))
        return alpha
    if lo is None and hi is None:  # torch.clamp needs one bound
        return alpha
    return alpha.clamp(min=lo, max=hi)
