"""GradInit configuration."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple

import torch

#: The paper's rule of thumb (Sec. 3.3): eta * gamma = 0.1 for Adam, eta * gamma**2 = 0.1 for SGD.
RULE_OF_THUMB = 0.1

OPTIMIZERS = ("adam", "sgd")
SGD_STEPS = ("grad", "normalized")


@dataclass
class GradInitConfig:
    """Options of :func:`fairseq_gradinit.core.gradinit`.

    Defaults are the paper's IWSLT14 recipe for Adam; for SGD on CIFAR use
    ``optimizer="sgd", eta=0.1, gamma=1.0``.
    """

    #: Optimizer the model will be trained with ("adam" or "sgd"). Sets A[g] and the norm p
    #: (Adam: A[g] = sign(g), p = 1; SGD: p = 2).
    optimizer: str = "adam"
    #: eta, the learning rate of the model's first training step that GradInit optimizes for.
    eta: float = 1e-3
    #: gamma, the bound on ||g||_p. ``None`` derives it from the rule of thumb
    #: (eta * gamma = 0.1 for Adam, eta * gamma**2 = 0.1 for SGD).
    gamma: Optional[float] = None
    #: tau, learning rate of the Adam optimizer that updates the scales.
    lr: float = 2.5e-3
    #: Adam betas of the scale optimizer.
    betas: Tuple[float, float] = (0.9, 0.98)
    #: Adam epsilon of the scale optimizer.
    eps: float = 1e-8
    #: Number of iterations. ``None``: one pass over ``batches``.
    iters: Optional[int] = 780
    #: Lower bound of every scale (the paper's alpha_min).
    min_scale: float = 0.01
    #: Optional upper bound of every scale.
    max_scale: Optional[float] = None
    #: Fraction of S~ drawn from S when GradInit forms the pairs itself (the paper uses 0.5).
    overlap: float = 0.5
    #: Clip the norm of the scale gradient to this value (``None``: no clipping).
    scale_grad_clip: Optional[float] = None
    #: SGD step form A[g]: "grad" uses A[g] = g (Eq. 2 and the authors' code); "normalized" uses
    #: A[g] = gamma * g / ||g||_2 (the text of Sec. 3.1). Ignored for Adam.
    sgd_step: str = "grad"
    #: Abort with an error after this many consecutive iterations with a non-finite loss/gradient.
    max_consecutive_skips: int = 10
    #: Log progress every this many iterations (through ``logging``).
    log_interval: int = 50
    #: Selects which tensors get a scale: ``fn(name, param) -> bool``. ``None``: every trainable
    #: parameter that is not all zeros. Shared (tied) tensors always get exactly one scale.
    param_filter: Optional[Callable[[str, torch.nn.Parameter], bool]] = field(default=None, repr=False)

    def __post_init__(self):
        self.validate()

    # -- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field and its allowed range."""
        def bad(name, allowed):
            raise ValueError(
                f"GradInitConfig.{name}={getattr(self, name)!r} is invalid: expected {allowed}"
            )

        def pos(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0

        if not isinstance(self.optimizer, str) or self.optimizer.lower() not in OPTIMIZERS:
            bad("optimizer", f"one of {OPTIMIZERS}")
        self.optimizer = self.optimizer.lower()
        if not pos(self.eta):
            bad("eta", "a finite number > 0 (the training learning rate)")
        if self.gamma is not None and not pos(self.gamma):
            bad("gamma", "a finite number > 0, or None to use the rule of thumb")
        if not pos(self.lr):
            bad("lr", "a finite number > 0 (the paper uses 1e-3 .. 1e-1)")
        try:
            b1, b2 = (float(b) for b in self.betas)
        except (TypeError, ValueError):
            bad("betas", "a pair of floats in [0, 1)")
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            bad("betas", "a pair of floats in [0, 1)")
        self.betas = (b1, b2)
        if not pos(self.eps):
            bad("eps", "a finite number > 0")
        if self.iters is not None and (not isinstance(self.iters, int) or isinstance(self.iters, bool)
                                       or self.iters < 0):
            bad("iters", "an integer >= 0, or None for one pass over the batches")
        if not pos(self.min_scale):
            bad("min_scale", "a finite number > 0 (the paper uses 0.01)")
        if self.max_scale is not None and not (pos(self.max_scale) and self.max_scale >= self.min_scale):
            bad("max_scale", f"None or a finite number >= min_scale ({self.min_scale})")
        if not (isinstance(self.overlap, (int, float)) and 0.0 <= self.overlap <= 1.0):
            bad("overlap", "a number in [0, 1]")
        if self.scale_grad_clip is not None and not pos(self.scale_grad_clip):
            bad("scale_grad_clip", "None or a finite number > 0")
        if self.sgd_step not in SGD_STEPS:
            bad("sgd_step", f"one of {SGD_STEPS}")
        if not isinstance(self.max_consecutive_skips, int) or self.max_consecutive_skips < 1:
            bad("max_consecutive_skips", "an integer >= 1")
        if not isinstance(self.log_interval, int) or self.log_interval < 1:
            bad("log_interval", "an integer >= 1")
        if self.param_filter is not None and not callable(self.param_filter):
            bad("param_filter", "None or a callable (name, param) -> bool")

    # -- derived quantities ---------------------------------------------------------------
    @property
    def norm_p(self) -> int:
        """The norm bounded by gamma: 1 for Adam, 2 for SGD."""
        return 1 if self.optimizer == "adam" else 2

    @property
    def resolved_gamma(self) -> float:
        """gamma, or the rule-of-thumb value when ``gamma`` is None."""
        if self.gamma is not None:
            return float(self.gamma)
        if self.optimizer == "adam":
            return RULE_OF_THUMB / self.eta
        return math.sqrt(RULE_OF_THUMB / self.eta)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "param_filter"}
        d["betas"] = list(self.betas)
        d["resolved_gamma"] = self.resolved_gamma
        d["param_filter"] = None if self.param_filter is None else getattr(
            self.param_filter, "__name__", repr(self.param_filter))
        return d
