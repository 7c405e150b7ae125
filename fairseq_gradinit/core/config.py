"""GradInit configuration."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple, Union

import torch

from .errors import ConfigError
from .recipe_values import AUTHORS_IWSLT14 as AUTHORS

#: The paper's rule of thumb (Sec. 3.3): eta * gamma = 0.1 for Adam, eta * gamma**2 = 0.1 for SGD.
RULE_OF_THUMB = 0.1
#: Bounds on the first step's first-order loss decrease (eta*gamma for Adam, eta*gamma^2 for SGD)
#: that derive gamma when it is not given, per rule of :func:`first_step`. The Python API and the
#: vision tools follow the paper's rule of thumb ("engine"); the fairseq plugin follows the settings
#: the authors ran on IWSLT ("fairseq": their Adam launch script: eta 1e-3, gamma 1e3; the paper's SGD
#: setting: eta 0.15, gamma 1), which the rule's 0.1 would shrink tenfold for Adam.
LOSS_CHANGE_BOUNDS = {
    "engine": {"adam": RULE_OF_THUMB, "sgd": RULE_OF_THUMB},
    "fairseq": {"adam": 1.0, "sgd": 0.15},
}
#: eta / the training learning rate when eta is not given, per rule of :func:`first_step`: the paper
#: optimizes the first step at the training learning rate ("engine"); the authors' IWSLT launch script
#: optimizes Adam's first step for eta 1e-3 at lr 5e-4, and the paper's SGD runs use eta = lr ("fairseq").
ETA_PER_LR = {
    "engine": {"adam": 1.0, "sgd": 1.0},
    "fairseq": {"adam": 2.0, "sgd": 1.0},
}


def default_gamma(optimizer: str, eta: float, bound: float) -> float:
    """The gamma for which the first step's first-order loss decrease is ``bound``: ``bound/eta``
    for Adam (a step of eta per coordinate), ``sqrt(bound/eta)`` for SGD."""
    if optimizer == "adam":
        return bound / eta
    return math.sqrt(bound / eta)


class FirstStep(NamedTuple):
    """eta and gamma of the simulated first step (gamma None: measured at the init, ``gamma_init_factor``)."""

    eta: float
    gamma: Optional[float]


def first_step(optimizer: str, train_lr: Optional[float] = None, *, eta: Optional[float] = None,
               gamma: Optional[float] = None, gamma_init_factor: Optional[float] = None,
               rule: str = "engine") -> FirstStep:
    """The eta and gamma GradInit prepares the first step of ``optimizer`` ("adam" or "sgd") for,
    each front end's one derivation of them from the training learning rate ``train_lr``.

    ``eta`` given, else ``ETA_PER_LR[rule][optimizer] * train_lr``; ``gamma`` given, else None with
    ``gamma_init_factor`` (gamma is then measured at the init), else :func:`default_gamma` with the
    bound ``LOSS_CHANGE_BOUNDS[rule][optimizer]``. An eta that is not a number > 0 derives no gamma
    (:class:`GradInitConfig` refuses it with its own message). ``rule``: "engine" (the paper's
    rule of thumb) or "fairseq" (the authors' IWSLT settings).
    """
    if rule not in ETA_PER_LR:
        raise ValueError(f"rule={rule!r} is invalid: expected one of {tuple(ETA_PER_LR)}")
    opt = optimizer.lower() if isinstance(optimizer, str) else optimizer
    if opt not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is invalid: expected one of {OPTIMIZERS}")
    if eta is None:
        if train_lr is None:
            raise ValueError("eta is not given and the training learning rate is unknown: pass eta or train_lr")
        eta = ETA_PER_LR[rule][opt] * train_lr
    if gamma is None and gamma_init_factor is None and is_positive(eta):
        gamma = default_gamma(opt, eta, LOSS_CHANGE_BOUNDS[rule][opt])
    return FirstStep(eta, gamma)


OPTIMIZERS = ("adam", "sgd")
SGD_STEPS = ("grad", "normalized")
CONSTRAINT_GRADS = ("exact", "finite_difference")
ADAM_STATES = ("shared", "per_branch")
STEP_PARAMS = ("all", "scaled")
#: Arithmetic of GradInit's loss passes (see ``GradInitConfig.precision``).
PRECISIONS = ("fp32", "tf32", "bf16")
#: How (S, S~) are formed from the batches (see ``GradInitConfig.pairs``).
PAIRS = ("overlap", "authors")
#: Named selectors of :class:`ScaleBound` (besides ``"re:<pattern>"`` and callables).
SCALE_SELECTORS = ("bias", "norm")


@dataclass(frozen=True)
class ScaleBound:
    """Bounds of the scales of the tensors that ``select`` picks; the first matching entry of
    ``GradInitConfig.scale_bounds`` wins, tensors that match none keep the global bounds.

    ``select`` is ``"bias"`` (parameters named ``*.bias``), ``"norm"`` (the weight of a
    normalization layer: LayerNorm, BatchNorm, GroupNorm, InstanceNorm, RMSNorm and any module
    class whose name ends in ``Norm``), ``"re:<pattern>"`` (``re.search`` on the parameter name)
    or a callable ``fn(name, param) -> bool``. A bound of ``None`` keeps the global value.
    Unlike the global ``min_scale``, a group's minimum may be 0 (the authors let biases reach 0).
    """

    select: Union[str, Callable[[str, Any], bool]]
    min_scale: Optional[float] = None
    max_scale: Optional[float] = None

    @classmethod
    def coerce(cls, item) -> "ScaleBound":
        """A ``ScaleBound`` from itself, a ``(select, min, max)`` tuple or a dict of its fields."""
        if isinstance(item, cls):
            bound = item
        elif isinstance(item, dict):
            bound = cls(**item)
        elif isinstance(item, (tuple, list)) and 1 <= len(item) <= 3:
            bound = cls(*item)
        else:
            raise ValueError(f"scale bound {item!r} is invalid: expected ScaleBound, (select, min_scale, "
                             "max_scale) or a dict with those keys, e.g. ('bias', 0, None)")
        bound.validate()
        return bound

    def validate(self) -> None:
        sel = self.select
        if isinstance(sel, str):
            if sel.startswith("re:"):
                try:
                    re.compile(sel[3:])
                except re.error as e:
                    raise ValueError(f"scale bound select={sel!r}: invalid regular expression ({e})") from None
            elif sel not in SCALE_SELECTORS:
                raise ValueError(f"scale bound select={sel!r} is invalid: expected one of {SCALE_SELECTORS}, "
                                 "'re:<pattern>' or a callable (name, param) -> bool")
        elif not callable(sel):
            raise ValueError(f"scale bound select={sel!r} is invalid: expected a string or a callable")
        lo, hi = self.min_scale, self.max_scale
        if lo is not None and not (_is_number(lo) and math.isfinite(lo) and lo >= 0):
            raise ValueError(f"scale bound {self.describe()}: min_scale={lo!r} must be None or a finite number >= 0")
        if hi is not None and not (_is_number(hi) and hi > 0 and not math.isnan(hi)):
            raise ValueError(f"scale bound {self.describe()}: max_scale={hi!r} must be None, a number > 0 or inf")
        if lo is not None and hi is not None and hi < lo:
            raise ValueError(f"scale bound {self.describe()}: max_scale {hi} is below min_scale {lo}")

    def describe(self) -> str:
        return self.select if isinstance(self.select, str) else getattr(self.select, "__name__", repr(self.select))

    def to_list(self) -> list:
        return [self.describe(), self.min_scale, self.max_scale]


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_positive(x) -> bool:
    """A finite real number > 0 (bools excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def invalid(cfg, name: str, allowed: str):
    """Raise the :class:`~.errors.ConfigError` (a ``ValueError``) for field ``name`` of the config dataclass ``cfg``."""
    raise ConfigError(name, getattr(cfg, name), allowed, owner=type(cfg).__name__)



def validate_lookahead(cfg) -> None:
    """The checks of ``lookahead_steps`` and ``lookahead_betas`` (``ValueError`` naming the field)."""
    if isinstance(cfg.lookahead_steps, bool) or not isinstance(cfg.lookahead_steps, int) or \
            cfg.lookahead_steps < 1:
        invalid(cfg, "lookahead_steps", "an integer >= 1 (1: the paper's one simulated step)")
    try:
        b1, b2 = (float(b) for b in cfg.lookahead_betas)
    except (TypeError, ValueError):
        b1 = b2 = math.nan
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        invalid(cfg, "lookahead_betas", "a pair of floats in [0, 1), e.g. (0.9, 0.98)")
    cfg.lookahead_betas = (b1, b2)
    if cfg.lookahead_steps > 1:
        if cfg.optimizer != "adam":
            invalid(cfg, "lookahead_steps", "1 with optimizer='sgd' (the simulated steps are Adam's)")
        if cfg.unstepped_uses is not None:
            invalid(cfg, "lookahead_steps", "1 with unstepped_uses (the simulated steps move every use)")


def validate_scale_fields(cfg, *, eps_field: str = "eps", lr_hint: str = "") -> None:
    """Check the fields every scale-learning config shares (GradInit and MetaInit): the Adam
    optimizer of the scales, the iteration count, the scale bounds and the run controls."""
    if not is_positive(cfg.lr):
        invalid(cfg, "lr", "a finite number > 0" + lr_hint)
    try:
        b1, b2 = (float(b) for b in cfg.betas)
    except (TypeError, ValueError):
        invalid(cfg, "betas", "a pair of floats in [0, 1)")
    if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
        invalid(cfg, "betas", "a pair of floats in [0, 1)")
    cfg.betas = (b1, b2)
    if not is_positive(getattr(cfg, eps_field)):
        invalid(cfg, eps_field, "a finite number > 0")
    if cfg.iters is not None and (not isinstance(cfg.iters, int) or isinstance(cfg.iters, bool) or cfg.iters < 0):
        invalid(cfg, "iters", "an integer >= 0, or None for one pass over the batches")
    # Every scale starts at 1: a floor above 1 forces all of them up, and nothing is learned.
    if not (is_positive(cfg.min_scale) and cfg.min_scale <= 1):
        invalid(cfg, "min_scale", "a number in (0, 1] (the paper uses 0.01)")
    if cfg.max_scale is not None and not (is_positive(cfg.max_scale) and cfg.max_scale >= cfg.min_scale):
        invalid(cfg, "max_scale", f"None or a finite number >= min_scale ({cfg.min_scale})")
    if cfg.scale_grad_clip is not None and not is_positive(cfg.scale_grad_clip):
        invalid(cfg, "scale_grad_clip", "None or a finite number > 0")
    if not isinstance(cfg.max_consecutive_skips, int) or cfg.max_consecutive_skips < 1:
        invalid(cfg, "max_consecutive_skips", "an integer >= 1")
    if not isinstance(cfg.log_interval, int) or cfg.log_interval < 1:
        invalid(cfg, "log_interval", "an integer >= 1")
    log_seconds = getattr(cfg, "log_seconds", 0.0)
    if not _is_number(log_seconds) or not math.isfinite(log_seconds) or log_seconds < 0:
        invalid(cfg, "log_seconds", "a finite number >= 0 (0: no progress lines by wall time)")
    for name in ("param_filter", "fixed_params"):
        if getattr(cfg, name, None) is not None and not callable(getattr(cfg, name)):
            invalid(cfg, name, "None or a callable (name, param) -> bool")


def config_to_dict(cfg) -> dict:
    """Fields of a config dataclass as JSON-ready values (``param_filter`` by name)."""
    callables = ("param_filter", "fixed_params")
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in callables}
    d["betas"] = list(cfg.betas)
    for name in callables:
        if hasattr(cfg, name):
            fn = getattr(cfg, name)
            d[name] = None if fn is None else getattr(fn, "__name__", repr(fn))
    if "scale_bounds" in d:
        d["scale_bounds"] = [b.to_list() for b in cfg.scale_bounds]
    return d


def option(default=dataclasses.MISSING, *, help: str, default_text: str = "", result: bool = True,
           choices: Optional[tuple] = None, python_only: bool = False, since: str = "",
           experimental: bool = False, **kwargs):
    """A field of a config dataclass that is also a user-facing option: ``help`` is its one
    description (command-line help, fairseq fields and the vision API are derived from it),
    ``result`` says whether it changes the learned scales (the fingerprint compares those),
    ``choices`` lists its allowed strings, ``python_only`` keeps it off the command line,
    ``default_text`` describes a default that is derived (e.g. from another option), and ``since``
    names the version that added a setting whose default reproduces what earlier versions computed
    (results saved before it match at that default). ``experimental`` marks a research setting (one
    that tests an explanation or a remedy; its default runs GradInit as the paper does): the
    generated option tables list those apart."""
    metadata = {"help": help, "default_text": default_text, "result": result, "choices": choices,
                "python_only": python_only, "since": since, "experimental": experimental}
    return field(default=default, metadata=metadata, **kwargs)


#: The fields whose default is not the authors' IWSLT'14 value (:data:`.recipe_values.AUTHORS_IWSLT14`),
#: and why: the recipe's value fits that Transformer, the engine's fits any model.
AUTHORS_DIFFERENCES = {
    "gamma": "derived from eta by the paper's rule of thumb, which fits any eta; the recipe's 1e3 goes with its "
             "eta of 1e-3",
    "adam_state": "one Adam over all iterations, as Algorithm 1 reads; separate moments are the authors' fairseq "
                  "code",
    "scale_bounds": "per-group bounds name the biases and LayerNorms of the authors' Transformer; without them "
                    "every scale has the global bounds",
    "unstepped_uses": "the recipe's pattern names fairseq's tied output projection, a module of that Transformer "
                      "only",
}


@dataclass
class GradInitConfig:
    """Options of :func:`fairseq_gradinit.core.gradinit`; each field's ``help`` describes it.

    Defaults: the authors' IWSLT'14 values (:data:`.recipe_values.AUTHORS_IWSLT14`: Adam, eta, tau,
    betas, iterations), except the fields listed in :data:`AUTHORS_DIFFERENCES`. The
    complete published settings are named recipes (:mod:`fairseq_gradinit.core.recipes`), e.g.
    ``recipe("paper-cifar10").config()`` for SGD on CIFAR-10. Command-line tools and the vision API
    derive their options from these fields (:mod:`fairseq_gradinit.core.options`).
    """

    optimizer: str = option(AUTHORS["optimizer"], choices=OPTIMIZERS, help=(
        "optimizer the model will be trained with, whose first step GradInit prepares: adam (A[g] = sign g, "
        "l1 norm) or sgd (A[g] = g, l2 norm)"))
    eta: float = option(AUTHORS["eta"], help="eta, the learning rate of the first training step that GradInit optimizes for")
    gamma: Optional[float] = option(None, help="gamma, the bound on ||g||_p", default_text=(
        "derived from eta by the paper's rule of thumb eta*gamma = 0.1 (Adam) or eta*gamma^2 = 0.1 (SGD)"))
    lr: float = option(AUTHORS["lr"], help="tau, the learning rate of the Adam optimizer that updates the scales")
    betas: Tuple[float, float] = option(AUTHORS["betas"], help="Adam betas of the scale optimizer, e.g. '(0.9, 0.98)'")
    eps: float = option(1e-8, help="Adam epsilon of the scale optimizer")
    iters: Optional[int] = option(AUTHORS["iters"], help="number of GradInit iterations",
                                  default_text=f"{AUTHORS['iters']}; None: one pass over the batches")
    min_scale: float = option(AUTHORS["min_scale"], help="lower bound of every scale (the paper's alpha_min)")
    max_scale: Optional[float] = option(None, help="upper bound of every scale (None: unbounded)")
    gamma_init_factor: Optional[float] = option(None, experimental=True, since="0.5.0", help=(
        "K: gamma = K * ||g||_p of the first iteration's S at the initial weights (before any scale step; the "
        "first iteration whose gradient is finite), so that the constraint rarely binds for K > 1; the gamma "
        "used is recorded in the result (its 'gamma' and config 'resolved_gamma'); excludes gamma; None: gamma "
        "or the rule of thumb"))
    overlap: float = option(AUTHORS["overlap"], help="fraction of S~ drawn from S (the paper uses 0.5)")
    pairs: str = option("overlap", experimental=True, since="0.5.0", choices=PAIRS, help=(
        "how (S, S~) are formed: overlap (S~ has the size of S and shares 'overlap' of it; from Python and the "
        "vision API S is one batch and S~ runs on into the next one; the fairseq plugin shuffles the samples of "
        "one draw and collates S and S~ apart) or authors (the authors' fairseq code: of one batch of n rows, "
        "in the order the batch holds them, S = rows [0, 2*(n//3)) and S~ = rows [n//3, n), one pair per batch; "
        "a fairseq batch is collated once, sorted by source length, padded width kept; needs overlap 0.5; a "
        "batch of fewer than 3 rows serves as both)"))
    adam_state: str = option("shared", choices=ADAM_STATES, help=(
        "moment estimates of the scales' Adam: shared (one Adam over all iterations, Algorithm 1 read "
        "literally) or per_branch (constraint and objective iterations keep their own moments and step "
        "counts, as the authors' fairseq code does)"))
    scale_grad_clip: Optional[float] = option(None, help="clip the norm of the scale gradient to this value "
                                                         "(None: no clipping)")
    sgd_step: str = option("grad", choices=SGD_STEPS, help=(
        "SGD step form A[g]: grad (A[g] = g, Eq. 2 and the authors' code) or normalized "
        "(A[g] = gamma*g/||g||_2, the text of Sec. 3.1); ignored for Adam"))
    reuse_graph: bool = option(True, result=False, help=(
        "after a constraint iteration, keep the second-order graph of the next first pass over S, so that a "
        "following constraint iteration costs one pass instead of two (the price: the first objective "
        "iteration after a run of constraint iterations carries that graph); the scales are the same"))
    constraint_grad: str = option("exact", choices=CONSTRAINT_GRADS, help=(
        "how constraint iterations get d||g||_p/d alpha: exact (double backward, Algorithm 1) or "
        "finite_difference ((g(theta + eps v) - g(theta)) / eps from one more first-order pass over S: "
        "cheaper, no second-order graph, approximate; eps = fd_eps * ||theta|| / ||v||)"))
    fd_eps: float = option(1e-4, help="relative step of constraint_grad finite_difference")
    max_consecutive_skips: int = option(10, result=False, help=(
        "stop with an error after this many consecutive iterations with a non-finite loss or gradient"))
    log_interval: int = option(50, result=False, help="log progress every this many iterations")
    log_seconds: float = option(30.0, result=False, help=(
        "also log progress, with the time elapsed and an estimate of the time left, whenever this many "
        "seconds of wall time have passed since the last progress line (0: only every log_interval iterations)"))
    scale_bounds: Sequence[ScaleBound] = option((), help=(
        "per-group bounds of the scales, first match wins: (select, min, max) with select 'bias', 'norm' "
        "(normalization weights), 're:<regex>' on the name (or, from Python, a callable), None keeping the "
        "global bound; e.g. the authors' Transformer setting [('bias', 0, None), ('norm', None, 100)]"))
    step_params: str = option(AUTHORS["step_params"], choices=STEP_PARAMS, help=(
        "which tensors enter g, ||g|| and the simulated step theta - eta*A[g]: all trainable tensors (as the "
        "real first step and the authors' code; tensors without a scale keep W_i) or only the scaled ones"))
    max_step_ratio: Optional[float] = option(None, experimental=True, since="0.4.0", help=(
        "Adam only: raise each scale's lower bound so that the sign step eta*A[g] is at most this fraction of "
        "the scaled tensor's root-mean-square, alpha_i >= eta / (ratio * rms(W_i)) (never above 1, nor above the "
        "tensor's upper bound; groups whose lower bound is 0, e.g. the authors' biases, are left alone): a "
        "tensor scaled far below eta is overwritten by the first updates of training, as without warmup; "
        "None: no such bound"))
    lookahead_steps: int = option(1, experimental=True, since="0.5.0", help=(
        "Adam only: how many training steps the objective simulates: 1, the paper's L(S~; theta - eta*sign(g)); "
        "K > 1, K steps of Adam (bias-corrected, eps 1e-8, lookahead_betas) from the init at learning rate eta, "
        "the first from g (sign g up to eps/|g|), each later one from the gradient on S where the earlier ones "
        "led, all held constant, and the loss on S~ after the K-th: scales whose first steps keep lowering the loss, "
        "not only the first; each step beyond the first costs one more forward/backward pass on S per objective "
        "iteration"))
    lookahead_betas: Tuple[float, float] = option((0.9, 0.98), experimental=True, since="0.5.0", help=(
        "with lookahead_steps > 1: the Adam betas of the simulated training steps (those of the training, "
        "e.g. '(0.9, 0.98)')"))
    loss_ceiling: Optional[float] = option(None, experimental=True, since="0.5.0", help=(
        "the most L(S; alpha W) may rise above its value at the initial scales (the first finite iteration's "
        "L(S)), in the loss's own units (nats per token with fairseq's criteria): an iteration whose L(S) lies "
        "above that bound and whose gradient norm is within gamma steps the scales down the gradient of L(S) "
        "(first order, from the gradient the iteration has already taken; Adam moments of the constraint steps) "
        "instead of taking its objective step, so that the scales cannot buy their objective with a model that is "
        "worse before training starts (e.g. sharper logits that widen a loss difference); None: no such bound"))
    dropout: bool = option(False, experimental=True, since="0.4.0", help=(
        "run GradInit's passes in train mode, dropout on, so that the scales are chosen for the loss training "
        "will see (the paper and the authors' code use eval mode, no dropout; normalization layers use batch "
        "statistics either way)"))
    unstepped_uses: Optional[str] = option(None, since="0.4.0", help=(
        "regular expression (re.search) on parameter names, aliases of tied tensors included: the uses it "
        "matches keep alpha*W in the simulated step theta - eta*A[g] while the tensor's other uses take the "
        "step, e.g. 'decoder\\.output_projection\\.' leaves a tied output projection un-stepped as the "
        "authors' fairseq code does; None: every use takes the step"))
    fixed_params: Optional[Callable[[str, torch.nn.Parameter], bool]] = option(None, python_only=True, repr=False,
                                                                               help=(
        "selects tensors that get a scale but that training does not update (e.g. a multiplier that is a "
        "buffer during training): fn(name, param) -> bool; their gradient stays out of g, ||g|| and the "
        "simulated step, as in the real first step; None: none"))
    precision: str = option("fp32", since="0.4.0", choices=PRECISIONS, help=(
        "arithmetic of the forward/backward passes: fp32; tf32 (CUDA matmuls and cuDNN convolutions of fp32 "
        "tensors use TF32 tensor cores during GradInit, the previous settings restored after; no effect on a "
        "CPU); bf16 (forward passes under torch.autocast with bfloat16, their backward and double backward in "
        "the dtypes autocast chose). The scales, their Adam, alpha*W, the gradients and both norms stay fp32. "
        "fp32 stays the default until the lower precisions are measured against it on a GPU"))
    param_filter: Optional[Callable[[str, torch.nn.Parameter], bool]] = option(None, python_only=True, repr=False,
                                                                               help=(
        "selects the tensors that get a scale: fn(name, param) -> bool; None: every trainable parameter that "
        "is not all zeros (tied tensors always get exactly one scale)"))

    def __post_init__(self):
        self.validate()

    # -- validation -----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field and its allowed range."""
        if not isinstance(self.optimizer, str) or self.optimizer.lower() not in OPTIMIZERS:
            invalid(self, "optimizer", f"one of {OPTIMIZERS}")
        self.optimizer = self.optimizer.lower()
        if not is_positive(self.eta):
            invalid(self, "eta", "a finite number > 0 (the training learning rate)")
        if self.gamma is not None and not is_positive(self.gamma):
            invalid(self, "gamma", "a finite number > 0, or None to use the rule of thumb")
        if not (isinstance(self.overlap, (int, float)) and 0.0 <= self.overlap <= 1.0):
            invalid(self, "overlap", "a number in [0, 1]")
        if self.gamma_init_factor is not None:
            if not is_positive(self.gamma_init_factor):
                invalid(self, "gamma_init_factor", "None or a finite number > 0, e.g. 2 (gamma = 2 ||g|| at the init)")
            if self.gamma is not None:
                invalid(self, "gamma_init_factor", f"None when gamma is set (gamma={self.gamma!r}): both set gamma, "
                                                   "pass one of them (gamma for a fixed bound, gamma_init_factor for "
                                                   "K times the gradient norm at the init)")
        if self.pairs not in PAIRS:
            invalid(self, "pairs", f"one of {PAIRS}")
        if self.pairs == "authors" and self.overlap != 0.5:
            invalid(self, "overlap", "0.5 with pairs='authors' (S and S~ are the first and the last two thirds "
                                     "of one batch, so they share half of S)")
        if self.sgd_step not in SGD_STEPS:
            invalid(self, "sgd_step", f"one of {SGD_STEPS}")
        if self.adam_state not in ADAM_STATES:
            invalid(self, "adam_state", f"one of {ADAM_STATES}")
        if not isinstance(self.reuse_graph, bool):
            invalid(self, "reuse_graph", "True or False")
        if not isinstance(self.dropout, bool):
            invalid(self, "dropout", "True or False")
        if self.step_params not in STEP_PARAMS:
            invalid(self, "step_params", f"one of {STEP_PARAMS}")
        if isinstance(self.scale_bounds, (str, bytes, ScaleBound)) or not isinstance(self.scale_bounds, Sequence):
            invalid(self, "scale_bounds", "a sequence of ScaleBound or (select, min_scale, max_scale) tuples")
        self.scale_bounds = tuple(ScaleBound.coerce(b) for b in self.scale_bounds)
        if self.max_step_ratio is not None:
            if not is_positive(self.max_step_ratio):
                invalid(self, "max_step_ratio", "None or a finite number > 0, e.g. 0.5")
            if self.optimizer != "adam":
                invalid(self, "max_step_ratio", "None with optimizer='sgd' (the bound is defined for Adam's sign "
                                                "step, whose size does not depend on the gradient)")
        validate_lookahead(self)
        if self.loss_ceiling is not None and not (_is_number(self.loss_ceiling) and math.isfinite(self.loss_ceiling)
                                                  and self.loss_ceiling >= 0):
            invalid(self, "loss_ceiling", "None or a finite number >= 0, e.g. 0.35 (half a bit per token in nats)")
        if self.unstepped_uses is not None:
            if not isinstance(self.unstepped_uses, str) or not self.unstepped_uses:
                invalid(self, "unstepped_uses", "None or a non-empty regular expression on parameter names")
            try:
                re.compile(self.unstepped_uses)
            except re.error as e:
                invalid(self, "unstepped_uses", f"a valid regular expression ({e})")
        if self.constraint_grad not in CONSTRAINT_GRADS:
            invalid(self, "constraint_grad", f"one of {CONSTRAINT_GRADS}")
        if not (is_positive(self.fd_eps) and self.fd_eps < 1):
            invalid(self, "fd_eps", "a number in (0, 1)")
        fd_floor = torch.finfo(torch.float32).eps  # the phase's dtype: a finite difference needs fp32 (below)
        if self.constraint_grad == "finite_difference" and self.fd_eps < fd_floor:
            invalid(self, "fd_eps", f"a number in [{fd_floor:.3g}, 1) with constraint_grad='finite_difference': a "
                                    "relative step below float32's resolution leaves the weights as they are, so "
                                    "the difference is 0 and no scale moves")
        if self.precision not in PRECISIONS:
            invalid(self, "precision", f"one of {PRECISIONS}")
        if self.precision != "fp32" and self.constraint_grad == "finite_difference":
            # The difference of two gradients fd_eps apart drowns in TF32/bf16 rounding (~1e-3).
            invalid(self, "precision", "'fp32' with constraint_grad='finite_difference' (a difference quotient "
                                       "needs fp32 gradients); use constraint_grad='exact' for tf32/bf16")
        validate_scale_fields(self, eps_field="eps", lr_hint=" (the paper uses 1e-3 .. 1e-1)")
        for b in self.scale_bounds:  # a side left at None takes the global bound: the range may end up empty
            lo = self.min_scale if b.min_scale is None else b.min_scale
            hi = self.max_scale if b.max_scale is None else b.max_scale
            if hi is not None and hi < lo:
                invalid(self, "scale_bounds", f"bounds with min <= max, but {b.describe()!r} gets [{lo}, {hi}] "
                                              "from the global min_scale/max_scale; give it both bounds")

    # -- derived quantities ---------------------------------------------------------------
    @property
    def norm_p(self) -> int:
        """The norm bounded by gamma: 1 for Adam, 2 for SGD."""
        return 1 if self.optimizer == "adam" else 2

    @property
    def resolved_gamma(self) -> Optional[float]:
        """gamma, or the rule-of-thumb value when ``gamma`` is None; None with ``gamma_init_factor``
        (gamma is then measured on the first batch: :attr:`GradInitResult.gamma`)."""
        gamma = first_step(self.optimizer, eta=self.eta, gamma=self.gamma,
                           gamma_init_factor=self.gamma_init_factor).gamma
        return None if gamma is None else float(gamma)

    def to_dict(self) -> dict:
        d = config_to_dict(self)
        d["resolved_gamma"] = self.resolved_gamma
        return d
