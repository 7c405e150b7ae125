"""Is a GradInit result healthy? Scales at their lower bound, the LayerNorm gains they cause, and
the signs of a delayed no-warmup shock: silenced blocks, a constraint-bound phase, pairs switched off.

GradInit can end in a result that starts well and then fails: many weight scales at their floor
(the paper reports that only the final FC layer ever reaches it) and Post-LN ``final_layer_norm``
weights scaled far below 1. The layer after such a LayerNorm receives the whole residual stream
shrunk by that factor, so the next LayerNorm divides by a tiny input standard deviation sigma and
its gain |gamma| / sigma grows far above Xavier's; training without warmup can then fall apart
after a good start. This module measures both on one batch, right after
GradInit, and gives a verdict with its reasons. The run these checks were drawn from, with its
numbers, is in docs/health.md.

Six checks, each with a threshold in :class:`HealthThresholds` (the reasoning is in its
docstring):

* tensors at their lower bound: each scale is compared with its OWN bound (the global
  ``min_scale`` or the first matching ``scale_bounds`` entry); weights (every tensor that is not a
  ``*.bias``) count for the verdict, biases are listed only (a bias scaled to its minimum 0 starts
  at zero, as many of fairseq's own biases do);
* LayerNorm weights scaled far below 1 (used for the verdict only when the gains were not measured:
  the gain shows whether the shrinking matters, e.g. it does not where the LayerNorm only feeds a
  residual branch, as in Pre-LN);
* per normalization layer, the input standard deviation and the gain |gamma| / sigma before the
  scales (the weights W) and after them (alpha * W), measured with
  :func:`~.norm_stats.norm_input_stats` in GradInit's mode (:func:`~.modes.gradinit_mode`: no
  dropout, batch statistics in BatchNorm). LayerNorm-like layers are judged; BatchNorm layers are
  listed (a BatchNorm re-normalizes every batch, and the thresholds were set on LayerNorm evidence);
* per block (:func:`block_of`, or the caller's :attr:`ModelStructure.blocks`), the root-mean-square of
  dL/dtheta before and after the scales on the same batch (:func:`block_gradient_rms`);
* the phase (:func:`phase_health`): the share of constraint iterations (||g|| at iteration 1
  against gamma is named as its cause); a phase without any objective iteration is always degenerate;
* multiplicative pairs (the caller's :attr:`ModelStructure.pairs`) with both scales near their lower bound.

The engine knows no model family: which sibling modules multiply and how parameters group into blocks is
data the caller passes as a :class:`ModelStructure` (the fairseq plugin passes fairseq's module names; the
default groups blocks by numbered modules and checks no pairs).
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from .config import GradInitConfig, ScaleBound
from .modes import gradinit_mode, unwrap_model
from .norm_stats import NormInputStats, is_stat_norm, norm_input_stats, recording_norm_inputs
from .scales import matching_bound, norm_weight_names

OK = "ok"
DEGENERATE = "degenerate"

#: Module names that are taken for normalization layers when there is no model to ask
#: (``layer_norm``, ``LayerNorm``, ``ln_f``, ``norm1``, ``bn2``...).
_NORM_NAME = re.compile(r"(norm|^ln(_\w+)?\d*$|^bn\d*$)", re.IGNORECASE)
_LAYER_NORM_NAME = re.compile(r"(layer_?norm|^ln(_\w+)?\d*$|^norm\d*$)", re.IGNORECASE)


@dataclass(frozen=True)
class ModelStructure:
    r"""How a model's parameters group for the health check, as names the caller gives.

    ``pairs``: sibling modules whose outputs multiply (attention logits q.k, values through the output
    projection, an FFN's two layers), by their attribute names, e.g. ``(("query", "key"),)``:
    scaling both down scales their branch by the product. Default: none.

    ``blocks``: a regular expression whose match at the start of a parameter name is that parameter's
    block (e.g. ``r"stages\.\d+\.\d+"``); names it does not match, and every name when
    None, go by :func:`block_of`: up to the first numeric part, else the module.

    ``sides``: the name prefixes of an encoder-decoder model's two stacks, the source side first (e.g.
    ``("encoder", "decoder")``): the check compares how much quieter the scales made each side's blocks
    (:func:`encoder_silencing`). Default: none.
    """

    pairs: Tuple[Tuple[str, str], ...] = ()
    blocks: Optional[str] = None
    sides: Tuple[str, ...] = ()

    def __post_init__(self):
        pairs = tuple(tuple(p) for p in self.pairs)
        if any(len(p) != 2 or not all(isinstance(n, str) and n for n in p) for p in pairs):
            raise ValueError(f"ModelStructure.pairs={self.pairs!r} is invalid: expected pairs of module names, "
                             "e.g. (('query', 'key'),)")
        object.__setattr__(self, "pairs", pairs)
        if self.blocks is not None:
            try:
                re.compile(self.blocks)
            except re.error as e:
                raise ValueError(f"ModelStructure.blocks={self.blocks!r} is invalid: {e}; expected a regular "
                                 "expression matching the start of a parameter name") from None

    def block(self, name: str) -> str:
        """The block of the parameter ``name``."""
        if self.blocks is not None:
            m = re.match(self.blocks, name)
            if m and m.group(0):
                return m.group(0)
        return block_of(name)


#: Blocks by numbered modules, no pairs: the default of every check.
GENERIC = ModelStructure()


@dataclass
class HealthThresholds:
    """When :func:`scale_health` calls a result degenerate (the run behind each value: docs/health.md).

    ``floor_fraction`` = 0.05 and ``floor_allowance`` = 1: degenerate when more weight tensors sit at
    their lower bound than max(``floor_allowance``, ``floor_fraction`` x the number of weight
    tensors). The paper reports that only the final FC layer ever reached the bound: one tensor.
    A weight at the floor 0.01 starts switched off: its elements are then about as small as one
    Adam step at a usual learning rate, so the first updates rewrite it, without warmup (the sizes:
    docs/health.md). A few such tensors in a large model are tolerated, a whole family of them is not.
    ``live_bound`` = 0.1: a tensor at a lower bound of at least this (one a user set with ``scale_bounds``)
    is listed but not counted as switched off: it keeps a tenth or more of its initial size, several Adam steps
    at a usual learning rate (the sizes: docs/health.md), so the first updates do not rewrite it. The pair check
    still applies: two such tensors of one branch near their bounds multiply into a branch many times quieter.

    ``min_layer_norm_scale`` = 0.1: in a Post-LN block the LayerNorm's output is the whole residual
    stream of the next sublayer, so scaling its weight by s shrinks the next LayerNorm's input by
    about s and multiplies that LayerNorm's gain by about 1/s; below 0.1 that is more than 10 times
    the initial gain, well past ``max_gain``. Used for the verdict only when the gains were not
    measured.

    ``max_gain`` = 4 and ``max_gain_ratio`` = 4: a LayerNorm amplifies changes of its input by its
    gain |gamma| / sigma (``core.norm_stats``). At Xavier's initialization the Post-LN
    Transformer's LayerNorms have gains near 1 (docs/health.md), so 4 is several times theirs.
    Degenerate when a LayerNorm's gain after the scales exceeds ``max_gain`` AND ``max_gain_ratio``
    times its gain before them (the ratio keeps a model that starts with high gains from being
    flagged for what GradInit did not cause; without a "before" measurement only ``max_gain``
    applies).

    ``max_block_quieting`` = 100: per block (a Transformer layer...), the RMS of dL/dtheta on the
    same batch before the scales over after them. Degenerate when one block's gradient is that many
    times quieter: the scales' objective (the loss after one step) hardly depends on such a block, so
    GradInit did not prepare its first steps; it barely moves at first and takes full-lr Adam steps
    once the rest of the model makes its gradient coherent, without a warmup to soften them.

    ``max_constraint_share`` = 0.6: constraint iterations only push ||g|| down; the scales of a phase
    made mostly of them answer "how to cut ||g|| fastest", not GradInit's objective. A phase that
    reaches gamma alternates between the two branches (at most about half constraint iterations); a
    share above 0.6 needs a long run of constraint iterations. Only the share decides, so that the
    reason never contradicts the branch counts printed beside it. ``max_initial_norm_ratio`` = 10:
    a ||g|| at iteration 1 more than this many times gamma forces such a run, and is named as its
    cause in the reason of a phase over the share; alone it flags nothing (a phase that starts far
    above gamma and then alternates did optimize its objective). A phase without any objective
    iteration is always flagged.

    ``pair_floor_factor`` = 2: a multiplicative pair (:attr:`ModelStructure.pairs`, e.g. an attention's
    query & key projections, or an FFN's two layers, of one module) is switched off together when both scales are at
    most twice their lower bound: the branch then carries the product of the two, at most 4e-4 of
    its initial output at the floor 0.01, and each tensor's gradient is scaled by the other's scale.
    A single tensor at the floor is tolerated by ``floor_allowance``, but a pair switches a whole
    branch off, so any such pair is flagged.

    ``max_loss_rise`` = 0.1: the loss on S at the learned scales (the mean of the phase's last ten
    iterations) against the first iteration's, as a fraction of it. An objective can be bought with a model that is
    worse before training starts, e.g. sharper logits, which widen every loss difference. The testbed's phases that
    did so, and what their models did, are in docs/health.md#loss-rose.

    ``max_encoder_quieting_ratio`` = 10: in an encoder-decoder model (blocks named ``encoder.*`` and
    ``decoder.*``), the median quieting of the encoder's blocks over the decoder's. The objective can lower the
    loss after a few steps fastest by silencing the encoder (a decoder that ignores its source is a language
    model, which learns faster); a model trained from such scales may never use its source. Silencing the
    encoder is one route to that, not the only one: docs/health.md#encoder-silenced has the testbed's phases.
    """

    floor_fraction: float = 0.05
    floor_allowance: int = 1
    live_bound: float = 0.1
    min_layer_norm_scale: float = 0.1
    max_gain: float = 4.0
    max_gain_ratio: float = 4.0
    max_block_quieting: float = 100.0
    max_constraint_share: float = 0.6
    max_initial_norm_ratio: float = 10.0
    pair_floor_factor: float = 2.0
    max_encoder_quieting_ratio: float = 10.0
    max_loss_rise: float = 0.1

    def __post_init__(self):
        for name in ("floor_fraction", "live_bound", "min_layer_norm_scale", "max_gain", "max_gain_ratio",
                     "max_block_quieting", "max_constraint_share", "max_initial_norm_ratio", "pair_floor_factor",
                     "max_encoder_quieting_ratio", "max_loss_rise"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"HealthThresholds.{name}={v!r} is invalid: expected a number >= 0")
        if isinstance(self.floor_allowance, bool) or not isinstance(self.floor_allowance, int) \
                or self.floor_allowance < 0:
            raise ValueError(f"HealthThresholds.floor_allowance={self.floor_allowance!r} is invalid: "
                             "expected an integer >= 0")


@dataclass
class NormHealth:
    """One normalization layer's input standard deviation and gain, before and after the scales."""

    name: str
    #: "layer_norm" (judged) or "batch_norm" (listed).
    kind: str
    input_std_after: float
    gain_after: float
    input_std_before: Optional[float] = None
    gain_before: Optional[float] = None

    @property
    def gain_ratio(self) -> Optional[float]:
        """gain_after / gain_before (None without a before measurement)."""
        if self.gain_before is None or not self.gain_before > 0:
            return None
        return self.gain_after / self.gain_before

    def to_dict(self) -> dict:
        # An input with zero spread has an infinite gain, which strict JSON cannot hold.
        return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v)
                for k, v in {**asdict(self), "gain_ratio": self.gain_ratio}.items()}


@dataclass
class BlockGradient:
    """One block's gradient root-mean-square on the same batch, before and after the scales."""

    name: str
    rms_after: float
    rms_before: Optional[float] = None

    @property
    def quieting(self) -> Optional[float]:
        """rms_before / rms_after: how many times quieter the scales made the block (None without before)."""
        if self.rms_before is None or not self.rms_before > 0:
            return None
        return self.rms_before / self.rms_after if self.rms_after > 0 else math.inf

    def to_dict(self) -> dict:
        q = self.quieting
        return {**asdict(self), "quieting": "inf" if q is not None and math.isinf(q) else q}


@dataclass
class PhaseHealth:
    """How the GradInit phase went: its branches and ||g|| at iteration 1 against gamma."""

    iterations: int
    objective: int
    constraint: int
    skipped: int
    #: ||g||_p of the first iteration with a finite gradient (at the initial weights).
    first_grad_norm: Optional[float]
    gamma: Optional[float]
    #: L(S) of the first iteration with a finite loss, and the mean of the last ten finite ones.
    first_loss: Optional[float] = None
    last_loss: Optional[float] = None

    @property
    def loss_rise(self) -> Optional[float]:
        """How much the loss on S rose over the phase, as a fraction of its first value (None without both,
        or when the first is not above 0)."""
        if self.first_loss is None or self.last_loss is None or not self.first_loss > 0:
            return None
        return self.last_loss / self.first_loss - 1.0

    @property
    def constraint_share(self) -> Optional[float]:
        """Constraint iterations over the iterations that were not skipped (None without any)."""
        n = self.objective + self.constraint
        return self.constraint / n if n else None

    @property
    def initial_norm_ratio(self) -> Optional[float]:
        if self.first_grad_norm is None or not self.gamma:
            return None
        return self.first_grad_norm / self.gamma

    def to_dict(self) -> dict:
        return {**asdict(self), "constraint_share": self.constraint_share,
                "initial_norm_ratio": self.initial_norm_ratio, "loss_rise": self.loss_rise}


@dataclass
class ScaleHealth:
    """The health check of one set of scales (:func:`scale_health`); ``to_dict()`` is JSON-ready."""

    #: "ok" or "degenerate".
    verdict: str
    #: Why it is degenerate, one line each under 200 characters with one example (empty when ok); the details
    #: (every tensor, block and pair, the phase's numbers) are in the fields below and in ``to_dict()``.
    reasons: List[str]
    #: Weight tensors (not ``*.bias``) at their lower bound: name -> (scale, lower bound).
    floor_weights: Dict[str, Tuple[float, float]]
    #: Biases at their lower bound: name -> (scale, lower bound); listed, not judged.
    floor_biases: Dict[str, Tuple[float, float]]
    num_weights: int
    num_biases: int
    #: LayerNorm weights scaled below ``min_layer_norm_scale``: name -> scale.
    small_layer_norm_scales: Dict[str, float]
    #: Normalization layers in forward order; None when no batch was measured.
    norms: Optional[List[NormHealth]]
    thresholds: HealthThresholds = field(default_factory=HealthThresholds)
    #: Things the check could not do (e.g. a bound it could not read), one sentence each.
    notes: List[str] = field(default_factory=list)
    #: Per block, forward order: gradient RMS before and after the scales; None when not measured.
    blocks: Optional[List[BlockGradient]] = None
    #: The phase's branches and first gradient norm; None without its history.
    phase: Optional[PhaseHealth] = None
    #: Multiplicative pairs switched off together: [name_a, name_b, scale_a, scale_b].
    pairs_off: List[list] = field(default_factory=list)
    #: An encoder-decoder model's sides' median block quieting and their ratio (:func:`encoder_silencing`).
    encoder_silencing: Optional[dict] = None

    @property
    def ok(self) -> bool:
        return self.verdict == OK

    def worst_norms(self, k: int = 3) -> List[NormHealth]:
        """The ``k`` LayerNorm-like layers with the highest gain after the scales."""
        layer = [n for n in self.norms or () if n.kind == "layer_norm"]
        return sorted(layer, key=lambda n: -n.gain_after)[:k]

    def to_dict(self) -> dict:
        floor = lambda d: {"count": len(d), "names": list(d), "scales": [v[0] for v in d.values()],  # noqa: E731
                           "lower_bounds": [v[1] for v in d.values()]}
        return {
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "floor": {"weights": {**floor(self.floor_weights), "of": self.num_weights},
                      "biases": {**floor(self.floor_biases), "of": self.num_biases}},
            "small_layer_norm_scales": dict(self.small_layer_norm_scales),
            "norms": None if self.norms is None else [n.to_dict() for n in self.norms],
            "thresholds": asdict(self.thresholds),
            "notes": list(self.notes),
            "blocks": None if self.blocks is None else [b.to_dict() for b in self.blocks],
            "phase": None if self.phase is None else self.phase.to_dict(),
            "pairs_off": [list(p) for p in self.pairs_off],
            "encoder_silencing": None if self.encoder_silencing is None else {
                k: "inf" if isinstance(v, float) and math.isinf(v) else v for k, v in self.encoder_silencing.items()},
        }

    def table(self, k: int = 3) -> List[str]:
        """A few log lines: verdict, reasons, tensors at the floor, the highest LayerNorm gains."""
        lines = [f"health: {self.verdict.upper()}"]
        lines += [f"  reason: {r}" for r in self.reasons]
        names = list(self.floor_weights)
        shown = ", ".join(names[:6]) + (f", ... (+{len(names) - 6})" if len(names) > 6 else "")
        lines.append(f"  weights at their lower bound: {len(names)} of {self.num_weights}"
                     + (f": {shown}" if names else ""))
        if self.floor_biases:
            lines.append(f"  biases at their lower bound: {len(self.floor_biases)} of {self.num_biases}")
        worst = self.worst_norms(k)
        if worst:
            lines.append(f"  {'LayerNorm (highest gain)':<44} {'std before':>10} {'gain before':>11} "
                         f"{'std after':>10} {'gain after':>10}")
            fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
            for n in worst:
                lines.append(f"  {n.name:<44} {fmt(n.input_std_before):>10} {fmt(n.gain_before):>11} "
                             f"{fmt(n.input_std_after):>10} {fmt(n.gain_after):>10}")
        elif self.norms is None:
            lines.append("  LayerNorm gains: not measured")
        lines += self._shock_lines()
        for note in self.notes:
            lines.append(f"  note: {note}")
        return lines

    def quietest_blocks(self, k: int = 3) -> List[BlockGradient]:
        """The ``k`` blocks the scales made the most times quieter."""
        measured = [b for b in self.blocks or () if b.quieting is not None]
        return sorted(measured, key=lambda b: -b.quieting)[:k]

    def _shock_lines(self) -> List[str]:
        lines = []
        quiet = self.quietest_blocks()
        if quiet:
            lines.append("  quietest blocks (gradient rms before / after the scales): " + ", ".join(
                f"{b.name} {b.quieting:.3g}x" for b in quiet))
        p = self.phase
        if p is not None:
            share = "-" if p.constraint_share is None else f"{100 * p.constraint_share:.0f}%"
            ratio = "-" if p.initial_norm_ratio is None else f"{p.initial_norm_ratio:.3g}"
            lines.append(f"  phase: {p.constraint} constraint / {p.objective} objective iterations ({share} "
                         f"constraint), ||g|| at iteration 1 / gamma = {ratio}")
        if self.pairs_off:
            lines.append(f"  pairs switched off together: {len(self.pairs_off)}")
        return lines


def bounds_of_config(config: Union[GradInitConfig, Mapping[str, Any], None]) -> Tuple[float, list, List[str]]:
    """(min_scale, scale_bounds, notes) of a :class:`GradInitConfig` or of its ``to_dict()`` (the
    ``config`` of a ``gradinit.json``). A bound that cannot be rebuilt from a file (a callable's
    name) is left out, with a note."""
    if config is None:
        return GradInitConfig.min_scale, [], []
    if isinstance(config, GradInitConfig):
        return float(config.min_scale), list(config.scale_bounds), []
    min_scale = float(config.get("min_scale", GradInitConfig.min_scale))
    bounds, notes = [], []
    for item in config.get("scale_bounds") or ():
        try:
            bounds.append(ScaleBound.coerce(item))
        except (ValueError, TypeError):
            notes.append(f"scale bound {item!r} cannot be rebuilt from the file; the tensors it selected are "
                         f"compared with the next matching bound or the global minimum {min_scale}")
    return min_scale, bounds, notes


def guess_norm_weight(name: str) -> bool:
    """Whether ``name`` looks like a normalization layer's weight (used when there is no model)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and bool(_NORM_NAME.search(parts[-2]))


def guess_layer_norm_weight(name: str) -> bool:
    """Whether ``name`` looks like a LayerNorm's weight (used when there is no model)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and bool(_LAYER_NORM_NAME.search(parts[-2]))


def _layer_norm_weight_names(model: nn.Module) -> set:
    out = set()
    for mname, m in model.named_modules():
        if is_stat_norm(m) and hasattr(m, "normalized_shape") and isinstance(getattr(m, "weight", None), nn.Parameter):
            out.add(f"{mname}.weight" if mname else "weight")
    return out


def _tolerance(lo: float) -> float:
    # Scales are stored in float32 (0.01 is saved as 0.009999999776): compare at float32 precision.
    return lo + max(abs(lo) * 1e-6, 1e-12)


def _judge(scales: Mapping[str, float], *, min_scale: float, bounds: Sequence, is_norm: Callable[[str], bool],
           is_layer_norm: Callable[[str], bool], params: Mapping[str, nn.Parameter],
           norms: Optional[List[NormHealth]], th: HealthThresholds, notes: List[str],
           blocks: Optional[List[BlockGradient]] = None, phase: Optional[PhaseHealth] = None,
           pairs: Sequence[Tuple[str, str]] = (), sides: Sequence[str] = ()) -> ScaleHealth:
    floor_w: Dict[str, Tuple[float, float]] = {}
    lows: Dict[str, float] = {}
    floor_b: Dict[str, Tuple[float, float]] = {}
    alive: set = set()
    n_w = n_b = 0
    small: Dict[str, float] = {}
    for name, value in scales.items():
        value = float(value)
        try:
            _, b = matching_bound(name, params.get(name), bounds, is_norm=is_norm(name))
        except Exception as e:  # noqa: BLE001 - a user's selector called without its tensor (scales only)
            b = None
            note = f"a scale bound's selector failed without the model ({type(e).__name__}); the global minimum is used"
            if note not in notes:
                notes.append(note)
        lo = lows[name] = min_scale if b is None or b.min_scale is None else float(b.min_scale)
        bias = name.rsplit(".", 1)[-1] == "bias"
        n_b, n_w = n_b + bias, n_w + (not bias)
        if b is not None and b.min_scale is not None and b.max_scale is not None and b.min_scale == b.max_scale:
            lows[name] = 0.0  # pinned by its bounds: kept where the user put it, not switched off by GradInit
            continue
        if value <= _tolerance(lo):
            (floor_b if bias else floor_w)[name] = (value, lo)
            # a group bound the user set at live_bound or above keeps the tensor alive (see HealthThresholds)
            if not bias and b is not None and b.min_scale is not None and lo >= th.live_bound:
                alive.add(name)
        if not bias and is_layer_norm(name) and value < th.min_layer_norm_scale:
            small[name] = value

    reasons = []
    allowed = max(th.floor_allowance, th.floor_fraction * n_w)
    switched_off = [n for n in floor_w if n not in alive]
    if len(switched_off) > allowed:
        reasons.append(f"{len(switched_off)} of {n_w} weight tensors are at their lower bound (more than "
                       f"{allowed:g} allowed), e.g. {switched_off[0]}: they start switched off")
    if len(switched_off) < len(floor_w):
        notes.append(f"{len(floor_w) - len(switched_off)} weight tensors sit at a lower bound of at least "
                     f"{th.live_bound:g} (scale_bounds): listed, not counted as switched off")
    if small and norms is None:
        name, value = min(small.items(), key=lambda kv: kv[1])
        reasons.append(f"{len(small)} LayerNorm weights scaled below {th.min_layer_norm_scale:g}, e.g. {name} "
                       f"x{value:.3g}: the next LayerNorm amplifies its shrunk input (gains not measured)")
    if norms is not None:
        high = []
        for n in norms:
            if n.kind != "layer_norm" or not n.gain_after > th.max_gain:
                continue
            ratio = n.gain_ratio
            if n.gain_before is not None and ratio is not None and ratio <= th.max_gain_ratio:
                continue
            high.append(n)
        if high:
            top = max(high, key=lambda n: n.gain_after)
            reasons.append(f"{len(high)} LayerNorms amplify their input by a gain |gamma|/sigma above "
                           f"{th.max_gain:g}" + (f" and {th.max_gain_ratio:g} times their gain before the scales"
                                                 if any(n.gain_before is not None for n in high) else "")
                           + f", the highest {top.name} {top.gain_after:.3g}")
    off = pairs_switched_off(scales, lows, th.pair_floor_factor, pairs=pairs)
    reasons += shock_reasons(blocks, phase, off, th, sides=sides)
    return ScaleHealth(verdict=DEGENERATE if reasons else OK, reasons=reasons, floor_weights=floor_w,
                       floor_biases=floor_b, num_weights=n_w, num_biases=n_b, small_layer_norm_scales=small,
                       norms=norms, thresholds=th, notes=list(notes), blocks=blocks, phase=phase, pairs_off=off,
                       encoder_silencing=encoder_silencing(blocks, sides))


def pairs_switched_off(scales: Mapping[str, float], lows: Mapping[str, float], factor: float, *,
                       pairs: Sequence[Tuple[str, str]] = ()) -> List[list]:
    """[name_a, name_b, scale_a, scale_b] for every pair of ``pairs`` (:attr:`ModelStructure.pairs`:
    weights of sibling modules) whose two scales are both at most ``factor`` times their lower bound."""
    out = []
    for name, value in scales.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[-1] != "weight":
            continue
        for a, b in pairs:
            if parts[-2] != a:
                continue
            other = ".".join(parts[:-2] + [b, "weight"])
            if other not in scales:
                continue
            near = [float(scales[n]) <= _tolerance(factor * lows.get(n, 0.0)) for n in (name, other)]
            if all(near):
                out.append([name, other, float(value), float(scales[other])])
    return out


def shock_reasons(blocks: Optional[List[BlockGradient]], phase: Optional[PhaseHealth], pairs: List[list],
                  th: HealthThresholds, *, sides: Sequence[str] = ()) -> List[str]:
    """The reasons that predict a delayed no-warmup shock: silenced blocks, a constraint-bound phase,
    multiplicative pairs switched off together (see :class:`HealthThresholds`)."""
    reasons = []
    silencing = encoder_silencing(blocks, sides)
    if silencing is not None and silencing["ratio"] >= th.max_encoder_quieting_ratio:
        source, target = sides[:2]
        reasons.append(f"the {source}'s blocks are {silencing['ratio']:.0f}x quieter than the {target}'s: the model "
                       "may learn to ignore its source (watch src_gap; docs/health.md#encoder-silenced)")
    quiet = [b for b in blocks or () if b.quieting is not None and b.quieting >= th.max_block_quieting]
    if quiet:
        top = max(quiet, key=lambda b: b.quieting)
        reasons.append(f"{len(quiet)} blocks have a gradient rms at least {th.max_block_quieting:g} times below "
                       f"the same model's before the scales, e.g. {top.name} {top.quieting:.3g}x: they stay still "
                       "at first")
    if phase is not None:
        reasons += _phase_reasons(phase, th)
    if pairs:
        a, b, _, _ = pairs[0]
        reasons.append(f"{len(pairs)} multiplicative pairs are switched off together (both scales within "
                       f"{th.pair_floor_factor:g} times their lower bound), e.g. {a.rsplit('.', 2)[0]} "
                       f"{a.split('.')[-2]}&{b.split('.')[-2]}")
    return reasons


def encoder_silencing(blocks: Optional[Sequence[BlockGradient]], sides: Sequence[str] = ()) -> Optional[dict]:
    """How much quieter the scales made an encoder-decoder model's source side than its target side: the median
    quieting of the blocks named ``sides[0].*``, of those named ``sides[1].*`` and their ``ratio``; None without
    two ``sides`` (:attr:`ModelStructure.sides`), where the blocks were not measured, or where a side has none."""
    if len(sides) < 2:
        return None
    def median_quieting(side):
        values = sorted(b.quieting for b in blocks or () if b.name.startswith(side + ".") and b.quieting is not None)
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    enc, dec = median_quieting(sides[0]), median_quieting(sides[1])
    if enc is None or dec is None or not dec > 0:
        return None
    return {"encoder_median_quieting": enc, "decoder_median_quieting": dec, "ratio": enc / dec}


def _phase_reasons(phase: PhaseHealth, th: HealthThresholds) -> List[str]:
    rise = phase.loss_rise
    risen = ([f"the loss on S at the learned scales rose from {phase.first_loss:.4g} to {phase.last_loss:.4g} "
              f"(+{100 * rise:.0f} %, more than {100 * th.max_loss_rise:.0f} %): the scales made the model worse "
              "before training starts (a loss ceiling bounds it; docs/health.md#loss-rose)"]
             if rise is not None and rise > th.max_loss_rise else [])
    return risen + _branch_reasons(phase, th)


def _branch_reasons(phase: PhaseHealth, th: HealthThresholds) -> List[str]:
    if phase.constraint and not phase.objective:
        return [f"no objective iteration ran: all {phase.constraint} iterations that were not skipped were "
                "constraint iterations, so the loss after one step was never optimized"]
    share, ratio = phase.constraint_share, phase.initial_norm_ratio
    # The share decides: a phase that started far above gamma but then alternated between the branches
    # optimized the loss after one step most of the time. A high start only explains a high share.
    if share is None or not share > th.max_constraint_share:
        return []
    why = [f"{phase.constraint} of {phase.objective + phase.constraint} iterations were constraint "
           f"iterations ({100 * share:.0f}%, more than {100 * th.max_constraint_share:.0f}%)"]
    if ratio is not None and ratio > th.max_initial_norm_ratio:
        why.append(f"||g|| at iteration 1 was {ratio:.3g} times gamma")
    return ["the phase was constraint-bound: " + " and ".join(why) + ": the scales mostly cut ||g||"]


def phase_health(history: Optional[Sequence[Any]], gamma: Optional[float]) -> Optional[PhaseHealth]:
    """:class:`PhaseHealth` of a GradInit history (``IterationRecord`` items or their dicts, as in
    ``gradinit.json``) and the gamma it ran with; None without a history."""
    if not history:
        return None
    get = lambda r, k: r.get(k) if isinstance(r, Mapping) else getattr(r, k, None)  # noqa: E731
    branches = [get(r, "branch") for r in history]
    norms = [get(r, "grad_norm") for r in history]
    first = next((float(g) for g in norms if g is not None and math.isfinite(g)), None)
    losses = [float(v) for v in (get(r, "loss_s") for r in history) if v is not None and math.isfinite(v)]
    last = losses[-10:]
    return PhaseHealth(iterations=len(history), objective=branches.count("objective"),
                       constraint=branches.count("constraint"), skipped=branches.count("skipped"),
                       first_grad_norm=first, gamma=None if gamma is None else float(gamma),
                       first_loss=losses[0] if losses else None, last_loss=sum(last) / len(last) if last else None)


def block_of(name: str) -> str:
    """The block a parameter belongs to: its name up to the first numeric part (``layers.3`` of
    ``layers.3.attn.weight``), else its module (``embed.weight``: ``embed``)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) or name


def block_gradient_rms(model: nn.Module, loss: Callable[[nn.Module], torch.Tensor], *,
                       norm_inputs: Optional[Dict[str, NormInputStats]] = None,
                       structure: ModelStructure = GENERIC) -> Dict[str, float]:
    """Per block (:meth:`ModelStructure.block`, forward order of the parameters), the root-mean-square of
    dL/dtheta over the block's trainable parameters, ``loss(model)`` run in GradInit's mode. With
    ``norm_inputs`` (a dict), the normalization layers' :class:`NormInputStats` of the same forward pass
    are recorded into it."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    recording = recording_norm_inputs(model) if norm_inputs is not None else contextlib.nullcontext({})
    with gradinit_mode(model), torch.enable_grad(), recording as stats:  # enable_grad: swapped_weights disables it
        value = loss(model)
        grads = torch.autograd.grad(value, [p for _, p in named], allow_unused=True)
    if norm_inputs is not None:
        norm_inputs.update(stats)
    sums: Dict[str, list] = {}
    for (name, p), g in zip(named, grads):
        acc = sums.setdefault(structure.block(name), [0.0, 0])
        acc[0] += 0.0 if g is None else float(g.detach().double().pow(2).sum())
        acc[1] += p.numel()
    return {b: math.sqrt(sq / n) for b, (sq, n) in sums.items() if n}


def scale_verdict(scales: Mapping[str, float], *, config: Union[GradInitConfig, Mapping[str, Any], None] = None,
                  norm_weights: Optional[Callable[[str], bool]] = None,
                  layer_norm_weights: Optional[Callable[[str], bool]] = None,
                  thresholds: Optional[HealthThresholds] = None, history: Optional[Sequence[Any]] = None,
                  gamma: Optional[float] = None, structure: ModelStructure = GENERIC) -> ScaleHealth:
    """The health check from the scales alone (no model, no batch): tensors at their lower bound,
    LayerNorm weights scaled far below 1, multiplicative pairs switched off together and, with the
    phase's ``history`` and ``gamma``, whether the phase was constraint-bound.

    Args:
        scales: name -> scale, e.g. ``gradinit.json``'s ``scales``.
        config: the run's :class:`GradInitConfig` or its dict (``gradinit.json``'s ``config``), for
            each tensor's lower bound; default: the global 0.01 for every tensor.
        norm_weights / layer_norm_weights: predicates on names for ``'norm'`` bounds and for the
            LayerNorm scale check; default: guessed from the names (:func:`guess_norm_weight`).
        thresholds: :class:`HealthThresholds`.
        history / gamma: the phase's :class:`~.engine.IterationRecord` list (or ``gradinit.json``'s
            ``history``) and the gamma it ran with (``GradInitResult.gamma``).
        structure: the model's multiplicative pairs (:class:`ModelStructure`; default: none checked).
    """
    min_scale, bounds, notes = bounds_of_config(config)
    return _judge(scales, min_scale=min_scale, bounds=bounds, is_norm=norm_weights or guess_norm_weight,
                  is_layer_norm=layer_norm_weights or guess_layer_norm_weight, params={}, norms=None,
                  th=thresholds or HealthThresholds(), notes=notes, phase=phase_health(history, gamma),
                  pairs=structure.pairs, sides=structure.sides)


def snapshot_weights(model: nn.Module) -> Dict[str, torch.Tensor]:
    """Copies of the model's floating-point parameters and buffers by name, for ``scale_health``'s
    ``initial``: take it before GradInit changes them."""
    inner = unwrap_model(model)
    out = {n: p.detach().clone() for n, p in inner.named_parameters()}
    out.update({n: b.detach().clone() for n, b in inner.named_buffers()
                if torch.is_floating_point(b) and n not in out})
    return out


@contextlib.contextmanager
def swapped_weights(model: nn.Module, values: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Inside: the parameters and buffers named in ``values`` hold those values; after (also on
    error): exactly what they held before."""
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if n not in tensors})
    saved = {}
    with torch.no_grad():
        try:
            for name, v in values.items():
                t = tensors.get(name)
                if t is None or t.shape != v.shape:
                    continue
                saved[name] = t.detach().clone()
                t.copy_(v)
            yield
        finally:
            for name, v in saved.items():
                tensors[name].copy_(v)


def _measure(model: nn.Module, forward: Callable[[nn.Module], Any]) -> Dict[str, NormInputStats]:
    with gradinit_mode(model):
        return norm_input_stats(model, forward)


def scale_health(model: nn.Module, scales: Mapping[str, float], forward: Optional[Callable[[nn.Module], Any]], *,
                 initial: Optional[Mapping[str, torch.Tensor]] = None,
                 config: Union[GradInitConfig, Mapping[str, Any], None] = None,
                 thresholds: Optional[HealthThresholds] = None,
                 loss: Optional[Callable[[nn.Module], torch.Tensor]] = None,
                 history: Optional[Sequence[Any]] = None, gamma: Optional[float] = None,
                 structure: ModelStructure = GENERIC) -> ScaleHealth:
    """The health check of ``scales`` on ``model``, which holds the scaled weights alpha * W (as
    :func:`~.engine.gradinit` and :func:`~.scales.apply_scales` leave it).

    Args:
        model: the model with the scales applied; it is left exactly as it was.
        scales: name -> scale (``GradInitResult.scales``).
        forward: ``forward(model)`` runs one batch (e.g. ``lambda m: loss_fn(m, batch)``); it is run
            without gradients in GradInit's mode (eval, batch statistics in BatchNorm), once after
            the scales and once before them if ``initial`` is given. None: the scales-only checks.
            With ``loss`` also given, the normalization inputs are recorded in the forward passes of
            ``loss`` instead (the same batch), so that each weight state costs one pass, not two.
        initial: the weights before the scales, by name (:func:`snapshot_weights` taken before
            GradInit); without it the gains before the scales are not measured.
        config: the :class:`GradInitConfig` (or its dict) the scales were learned with: each
            tensor's lower bound.
        thresholds: :class:`HealthThresholds`.
        loss: ``loss(model)`` -> the scalar loss of the same batch (e.g. ``lambda m: loss_fn(m, batch)``):
            each block's gradient RMS after the scales and, with ``initial``, before them (run with
            gradients, in GradInit's mode); None: not measured.
        history / gamma: as in :func:`scale_verdict`.
        structure: the model's blocks and multiplicative pairs (:class:`ModelStructure`; default:
            blocks by numbered modules, no pairs).

    Returns:
        A :class:`ScaleHealth` (``verdict``, ``reasons``, ``to_dict()``, ``table()``).
    """
    inner = unwrap_model(model)
    th = thresholds or HealthThresholds()
    min_scale, bounds, notes = bounds_of_config(config)
    params = dict(inner.named_parameters(remove_duplicate=False))
    norm_names = norm_weight_names(inner)
    layer_norm_names = _layer_norm_weight_names(inner)
    norms = None
    if forward is not None and loss is not None:
        # One pass per weight state: the norm inputs are recorded in the forward pass of the gradients.
        after: Dict[str, NormInputStats] = {}
        before: Optional[Dict[str, NormInputStats]] = {} if initial is not None else None
        blocks = _blocks(inner, loss, initial, structure, norm_inputs=(after, before))
    elif forward is not None:
        after = _measure(inner, forward)
        before = None
        if initial is not None:
            with swapped_weights(inner, initial):
                before = _measure(inner, forward)
    if forward is not None:
        kinds = {name: ("layer_norm" if hasattr(m, "normalized_shape") else "batch_norm")
                 for name, m in inner.named_modules() if is_stat_norm(m)}
        norms = []
        for name, s in after.items():
            b = before.get(name) if before is not None else None
            norms.append(NormHealth(name=name, kind=kinds.get(name, "layer_norm"), input_std_after=s.input_std,
                                    gain_after=s.gain, input_std_before=None if b is None else b.input_std,
                                    gain_before=None if b is None else b.gain))
    if forward is None or loss is None:
        blocks = _blocks(inner, loss, initial, structure)
    return _judge(scales, min_scale=min_scale, bounds=bounds, is_norm=lambda n: n in norm_names or (
        n not in params and guess_norm_weight(n)), is_layer_norm=lambda n: n in layer_norm_names,
        params=params, norms=norms, th=th, notes=notes, blocks=blocks, phase=phase_health(history, gamma),
        pairs=structure.pairs, sides=structure.sides)


def _blocks(model: nn.Module, loss, initial, structure: ModelStructure, *,
            norm_inputs: tuple = (None, None)) -> Optional[List[BlockGradient]]:
    """Each block's gradient RMS after the scales and, with ``initial``, before them; ``norm_inputs``
    (after, before): dicts that receive the norm input statistics of the same passes (None: not recorded)."""
    if loss is None:
        return None
    after = block_gradient_rms(model, loss, norm_inputs=norm_inputs[0], structure=structure)
    before = None
    if initial is not None:
        with swapped_weights(model, initial):
            before = block_gradient_rms(model, loss, norm_inputs=norm_inputs[1], structure=structure)
    return [BlockGradient(name=b, rms_after=rms, rms_before=None if before is None else before.get(b))
            for b, rms in after.items()]
