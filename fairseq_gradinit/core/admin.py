"""Admin's initialization of the w_skip residual scale ω (Liu et al., 2020), in plain PyTorch.

In Admin's Post-LN variant every residual is ``LN(x * ω + f(x))`` with a learnable vector ω. Two
rules set ω at initialization:

* :class:`AdminProfile` - the profiling rule of Admin's released implementation
  (LiyuanLucasLiu/Transformer-Clinic, ``--init-type adaptive-profiling``): one forward pass of the
  untrained model on one training batch, in train mode (dropout on), visiting the residuals of a
  stack (encoder or decoder) in forward order. With a running value ``r`` that starts at 1::

      ω_i  = r                                   (every entry of ω_i)
      r    = sqrt(Var[x_i * ω_i] + Var[f_i(x_i)])

  ``x_i`` is the residual's input (the shortcut) and ``f_i(x_i)`` the branch output after dropout.
  Each variance is the population variance (``np.var``, ddof 0) of *all* entries of the
  ``(time, batch, channel)`` tensor, padding positions included, as Admin computes it. The value of
  ``r`` after the stack's last residual is not used. Since ``x_i`` is the output of a LayerNorm
  with unit weight (Var ≈ 1), ω_i² ≈ 1 + Σ_{j<i} Var[f_j]: the shortcut carries as much variance as
  all the branches before it.
* :func:`closed_form_omega` - the rule of the ``admin-torch`` package (0.1.0, ``calculate_init``),
  which needs no data: ω = sqrt((N + 1) / ln(N + 1) - 1) for a stack of N residuals
  (``output_change_scale='O(logn)'``, its default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch

__all__ = ["AdminProfile", "closed_form_omega"]


def closed_form_omega(num_residuals: int, *, use_package: bool = True) -> float:
    """ω of ``admin_torch.calculate_init(num_residuals)`` ('O(logn)'), the package's default.

    Calls the ``admin-torch`` package when it is installed (``pip install ".[admin]"``) and
    ``use_package`` is true; otherwise evaluates the same formula.
    """
    if not isinstance(num_residuals, int) or num_residuals < 1:
        raise ValueError(f"num_residuals must be a positive integer, got {num_residuals!r}")
    if use_package:
        try:
            import admin_torch
        except ImportError:
            pass
        else:
            return float(admin_torch.calculate_init(num_residuals))
    return math.sqrt((num_residuals + 1) / math.log(num_residuals + 1) - 1)


@dataclass
class AdminProfile:
    """Admin's profiling rule for one residual stack (see the module docstring).

    Call :meth:`visit` at each residual, in forward order, *before* the residual is computed: it
    writes the current running value into ω (in place) and advances the running value.
    """

    #: ω written so far, one per visited residual, in order (0-dim tensors on the model's device).
    omegas: List[torch.Tensor] = field(default_factory=list)
    _ratio: Optional[torch.Tensor] = field(default=None, init=False, repr=False)

    @torch.no_grad()
    def visit(self, omega: torch.Tensor, branch: torch.Tensor, shortcut: torch.Tensor) -> None:
        """Set ``omega`` from the residuals before it and account for this one.

        ``branch`` is f(x) after dropout, ``shortcut`` the residual input x.
        """
        if self._ratio is None:
            self._ratio = torch.ones((), dtype=torch.float32, device=omega.device)
        omega.fill_(self._ratio.to(omega.dtype))
        self.omegas.append(self._ratio.clone())
        var_in = torch.var((shortcut * omega).float(), correction=0)
        var_out = torch.var(branch.float(), correction=0)
        self._ratio = torch.sqrt(var_in + var_out)

    def values(self) -> List[float]:
        """The ω values as Python floats (one host sync)."""
        return torch.stack(self.omegas).tolist() if self.omegas else []
