"""A training monitor for long runs (``--gradinit-monitor-interval N``): ``monitor.jsonl`` in ``--save-dir``.

Every N updates, rank 0 appends one ``interval`` record: the loss scale, fp16 overflows and skipped
updates since the previous record, per group (encoder/decoder x layer x kind) the weight norm and
the update/weight ratio of the last update, and on a fixed batch (the first training batch this
process saw) in eval and in train mode: the input standard deviation and gain of every LayerNorm,
each self-attention's entropy and largest logit, each residual branch's output norm against its
residual (:mod:`.monitor_stats`), and the loss, whose eval - train gap warns when it jumps
(:data:`GAP_JUMP`). Each step whose gradient norm is not finite adds an ``overflow`` record, written
before fairseq zeroes the gradients: the parameters whose gradients were not finite, the one where
the non-finite value began (first in backward order, noted by a gradient hook per parameter), the
batch's padded lengths and the signature of cuDNN attention's NaN query gradients
(:mod:`fairseq_gradinit.core.sdpa_guard`). A ``start`` record opens each run's part of the file (a
resumed run appends). The schema is in ``docs/monitor.md``.

Cost: per update, one call around the optimizer's ``clip_grad_norm``, a counter, the batch's lengths
and one Python hook call per parameter in backward; every N updates a copy of the weights before the
step, two forward passes without gradients on the fixed batch (with the attention logits computed
again) and one norm per tensor. Nothing when the option is 0.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from ...core.norm_stats import norm_input_stats
from ...core.sdpa_guard import HALF_PRECISIONS, SdpaEnvironment, assess
from ...files.paths import json_text
from ...version import __version__
from .groups import transformer_place
from .monitor_stats import recording_attention, recording_branches

logger = logging.getLogger(__name__)

MONITOR_JSONL = "monitor.jsonl"
#: Overflow records written per interval; further overflows are only counted (a run whose loss scale
#: collapses overflows on most steps, and the first ones of each interval say where).
MAX_OVERFLOW_RECORDS = 20
#: The eval - train loss gap on the fixed batch (bits) warns when it is positive and at least this
#: far above its lowest value in this run's earlier records, and again each time it rises this much
#: more: with dropout on, train-mode loss is the higher one in a healthy run and the gap only drifts,
#: while eval mode breaking away makes it jump (the threshold's reasoning: docs/monitor.md).
GAP_JUMP = 0.4
#: A padded length of this residue (mod 128) is where cuDNN attention's backward returns NaN
#: query gradients (:mod:`fairseq_gradinit.core.sdpa_guard`).
BUG_LENGTH_MODULUS, BUG_LENGTH_RESIDUE = 128, 64


def monitor_from_plan(plan) -> Optional["TrainingMonitor"]:
    """The monitor a run's plan asks for, or None when ``--gradinit-monitor-interval`` is 0."""
    if plan.monitor_interval <= 0:
        return None
    return TrainingMonitor(interval=plan.monitor_interval, path=os.path.join(plan.save_dir, MONITOR_JSONL),
                           seed=plan.seed)


# --------------------------------------------------------------------------------------------
# what the records are made of
# --------------------------------------------------------------------------------------------
def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside data-parallel wrappers (their parameter names carry a ``module.`` prefix)."""
    from fairseq.distributed import LegacyDistributedDataParallel, ModuleProxyWrapper

    wrappers = (nn.parallel.DistributedDataParallel, ModuleProxyWrapper, LegacyDistributedDataParallel)
    while isinstance(model, wrappers):
        model = model.module
    return model


def group_of(name: str) -> str:
    """The record's group of a parameter: ``side.layer.kind`` (``decoder.3.self_attn.q``), or
    ``side.kind`` outside the layers (``encoder.embed_tokens``); weight and bias together."""
    place = transformer_place(name)
    return f"{place.side}.{place.kind}" if place.layer is None else f"{place.side}.{place.layer}.{place.kind}"


def loss_scale(optimizer) -> Optional[float]:
    """The current loss scale of fairseq's FP16/MemoryEfficientFP16 (``scaler.loss_scale``) or AMP
    (``scaler.get_scale()``) optimizer; None without a scaler (fp32, bf16)."""
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None:
        return None
    if hasattr(scaler, "loss_scale"):
        return float(scaler.loss_scale)
    if hasattr(scaler, "get_scale"):
        return float(scaler.get_scale())
    return None


def training_weights(optimizer, model: nn.Module) -> Tuple[List[Tuple[str, torch.Tensor]], str]:
    """``([(name, tensor)], source)``: the weights the optimizer updates, by parameter name. Under
    fairseq's FP16Optimizer these are its fp32 master copies (views into its flat buffer), so that
    small updates are not lost to fp16 rounding (``source`` "fp32 master"); otherwise the model's
    own trainable parameters ("model")."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    names = {id(p): n for n, p in named}
    fp16, fp32 = getattr(optimizer, "fp16_params", None), getattr(optimizer, "fp32_params", None)
    if fp16 is not None and fp32 is not None:
        if isinstance(fp32, dict) and len(fp32) == 1:
            flat = next(iter(fp32.values())).detach()
            if sum(p.numel() for p in fp16) == flat.numel():
                out, offset = [], 0
                for p in fp16:
                    if id(p) in names:
                        out.append((names[id(p)], flat[offset:offset + p.numel()].view(p.shape)))
                    offset += p.numel()
                return out, "fp32 master"
        elif isinstance(fp32, (list, tuple)) and len(fp32) == len(fp16):
            return [(names[id(p)], q.detach()) for p, q in zip(fp16, fp32) if id(p) in names], "fp32 master"
    return [(n, p.detach()) for n, p in named], "model"


def sum_of_squares(tensors: Sequence[torch.Tensor]) -> List[float]:
    """Each tensor's sum of squares (in fp32), with one transfer to the host."""
    if not tensors:
        return []
    return torch.stack([t.float().pow(2).sum() for t in tensors]).tolist()


def group_update_stats(names: Sequence[str], before: Sequence[torch.Tensor],
                       after: Sequence[torch.Tensor]) -> Dict[str, dict]:
    """Per group: ``weight_norm`` ||theta|| after the update and ``update_ratio``
    ||theta_after - theta_before|| / ||theta_before|| (None where ||theta_before|| = 0)."""
    w_after = sum_of_squares(after)
    w_before = sum_of_squares(before)
    delta = sum_of_squares([a.float() - b.float() for a, b in zip(after, before)])
    acc: Dict[str, List[float]] = {}
    for name, wa, wb, d in zip(names, w_after, w_before, delta):
        g = acc.setdefault(group_of(name), [0.0, 0.0, 0.0])
        g[0] += wa
        g[1] += wb
        g[2] += d
    return {g: {"weight_norm": math.sqrt(wa), "update_ratio": math.sqrt(d) / math.sqrt(wb) if wb > 0 else None}
            for g, (wa, wb, d) in acc.items()}


def where(name: str, position: Optional[int] = None) -> dict:
    """A parameter as a record names it: ``param``, ``module``, ``group`` (and its backward position)."""
    out = {"param": name, "module": name.rpartition(".")[0], "group": group_of(name)}
    if position is not None:
        out["backward_position"] = position
    return out


def nonfinite_gradients(model: nn.Module, backward_order: Optional[Dict[str, int]] = None) -> Optional[dict]:
    """Which parameters of ``model`` have a gradient with an inf or NaN entry: their count, the number
    of parameters with a gradient, the first and last of them in module order, and ``born_in``: the
    first of them in backward order (``backward_order``: parameter name -> the position at which
    backward reached it), where the non-finite value entered the gradients, and ``hits``, every
    such parameter's name. None when every gradient is finite."""
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        return None
    bad = torch.stack([~torch.isfinite(g).all() for _, g in named]).tolist()
    hits = [n for (n, _), b in zip(named, bad) if b]
    if not hits:
        return None
    order = backward_order or {}
    ordered = sorted((order[n], n) for n in hits if n in order)
    born = where(ordered[0][1], ordered[0][0]) if ordered else None
    return {"count": len(hits), "of": len(named), "first": where(hits[0]), "last": where(hits[-1]),
            "born_in": born, "hits": hits}


def batch_lengths(sample) -> dict:
    """``source`` and ``target``: the padded lengths of a fairseq batch (None where absent)."""
    def width(t):
        return int(t.shape[-1]) if torch.is_tensor(t) and t.dim() == 2 else None

    net_input = (sample or {}).get("net_input") or {}
    return {"source": width(net_input.get("src_tokens")), "target": width((sample or {}).get("target"))}


def known_bug_signature(nonfinite: Optional[dict], lengths: List[dict], half: bool,
                        affected_torch: Optional[bool]) -> dict:
    """The signature of cuDNN attention's NaN query gradients: non-finite values born in a
    self-attention's ``q_proj`` with its ``k_proj``/``v_proj`` finite, half precision, a padded length
    (source for the encoder, target for the decoder) of 64 (mod 128), and cuDNN attention on with
    an affected torch (``affected_torch``; None: not known). ``match`` when all hold."""
    born = (nonfinite or {}).get("born_in") or {}
    module = born.get("module", "")
    attention = module[: -len(".q_proj")] if module.endswith("self_attn.q_proj") else None
    q_only = attention is not None and not any(
        h.startswith(f"{attention}.{p}.") for h in nonfinite["hits"] for p in ("k_proj", "v_proj"))
    side = "source" if module.startswith("encoder.") else "target"
    length = any(b.get(side) is not None and b[side] % BUG_LENGTH_MODULUS == BUG_LENGTH_RESIDUE for b in lengths)
    out = {"q_proj_only": q_only, "half_precision": half, "length_64_mod_128": length,
           "affected_torch": affected_torch}
    out["match"] = bool(q_only and half and length and affected_torch)
    return out


def cudnn_attention_affected(precision: str, device: torch.device, guard: Optional[dict]) -> Optional[bool]:
    """Whether the fault of :mod:`~fairseq_gradinit.core.sdpa_guard` can occur now: False with cuDNN
    attention off; else the guard's assessment, or one from the versions (None: not known)."""
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    if guard is not None and guard.get("affected") is not None:
        return bool(guard["affected"])
    return assess(SdpaEnvironment.detect(device), precision)[0]


@contextlib.contextmanager
def norm_statistics_kept(model: nn.Module):
    """Restores BatchNorm running statistics that a train-mode forward pass would change."""
    saved = [(b, b.detach().clone()) for m in model.modules() if isinstance(m, _NormBase) for b in m.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)


#: Blocks of measured statistics, written with 6 significant digits (loss scales and counts stay exact).
ROUNDED_BLOCKS = ("fixed_batch_loss", "groups", "norms", "summary", "attention", "branches", "eval_train_gap")


def finite_or_text(value, digits: Optional[int] = None):
    """JSON has no inf/NaN: such floats become the strings "inf", "-inf", "nan"; other floats are
    rounded to ``digits`` significant digits when given."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return float(f"{value:.{digits}g}") if digits else value
    if isinstance(value, dict):
        return {k: finite_or_text(v, 6 if k in ROUNDED_BLOCKS else digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_text(v, digits) for v in value]
    return value


def _extreme(entries: Dict[str, Optional[float]], pick) -> Tuple[Optional[float], Optional[str]]:
    finite = {k: v for k, v in entries.items() if v is not None and math.isfinite(v)}
    if not finite:
        return None, None
    key = pick(finite, key=finite.get)
    return finite[key], key


def summary_of(groups: Dict[str, dict], norms: Dict[str, dict], attention: Optional[Dict[str, dict]] = None,
               branches: Optional[Dict[str, dict]] = None) -> dict:
    """The extremes a curve plots: largest update ratio, smallest LayerNorm input std and largest
    LayerNorm gain, largest self-attention logit, smallest attention entropy and largest branch/residual
    ratio, in eval and train mode, each with where it was."""
    out = {}
    out["max_update_ratio"], out["max_update_ratio_group"] = _extreme(
        {g: s["update_ratio"] for g, s in groups.items()}, max)
    for mode in ("eval", "train"):
        out[f"min_ln_input_std_{mode}"], out[f"min_ln_input_std_{mode}_module"] = _extreme(
            {m: s[mode]["input_std"] for m, s in norms.items() if mode in s}, min)
        out[f"max_ln_gain_{mode}"], out[f"max_ln_gain_{mode}_module"] = _extreme(
            {m: s[mode]["gain"] for m, s in norms.items() if mode in s}, max)
        att = {m: s[mode] for m, s in (attention or {}).items() if "max_logit" in s.get(mode, {})}
        out[f"max_attn_logit_{mode}"], out[f"max_attn_logit_{mode}_module"] = _extreme(
            {m: s["max_logit"] for m, s in att.items()}, max)
        out[f"min_attn_entropy_{mode}"], out[f"min_attn_entropy_{mode}_module"] = _extreme(
            {m: s["entropy"] for m, s in att.items()}, min)
        out[f"max_branch_ratio_{mode}"], out[f"max_branch_ratio_{mode}_branch"] = _extreme(
            {f"{layer}.{b}": r[mode] for layer, bs in (branches or {}).items() for b, r in bs.items() if mode in r},
            max)
    return out


def gap_warning(gap: Optional[float], baseline: Optional[float], warned: Optional[float]) -> bool:
    """Whether the eval - train gap warns (:data:`GAP_JUMP`): positive, at least GAP_JUMP above the
    lowest earlier gap (``baseline``) and, after a warning at ``warned``, GAP_JUMP above that."""
    if gap is None or baseline is None or not math.isfinite(gap) or gap <= 0 or gap - baseline < GAP_JUMP:
        return False
    return warned is None or gap - warned >= GAP_JUMP


# --------------------------------------------------------------------------------------------
# the monitor
# --------------------------------------------------------------------------------------------
class TrainingMonitor:
    """Writes ``monitor.jsonl`` (see the module docstring); driven by the task's ``train_step`` and
    ``optimizer_step`` (:class:`~..registration.hook.GradInitTaskMixin`)."""

    def __init__(self, *, interval: int, path: str, seed: int = 1):
        self.interval = int(interval)
        self.path = path
        self.seed = seed
        self.fixed_batch = None
        self.criterion = None
        self.last_update: Optional[int] = None  # update of the start or the last interval record
        self.attempts = 0  # clip_grad_norm calls (one per trainer step) since the last record
        self.overflows = 0
        self.overflows_recorded = 0
        self.attempt_overflowed = False
        self.current_update: Optional[int] = None  # updates completed before the step under way
        self.sdpa_guard: Optional[dict] = None  # the cuDNN attention guard's decision (set by the task)
        self.precision: Optional[str] = None
        self.backward_order: Dict[str, int] = {}  # parameter -> when backward reached it, this step
        self.hooked: Optional[int] = None  # id of the model whose parameters carry the order hooks
        self.lengths: List[dict] = []  # padded lengths of the batches since the last clip_grad_norm
        self.gap_baseline: Optional[float] = None  # lowest eval - train gap of this run's records
        self.gap_warned: Optional[float] = None  # the gap of the last warning

    @property
    def writes(self) -> bool:
        return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0

    def write(self, record: dict) -> None:
        # A monitor never stops the run it watches: a write error (disk full, permissions) is
        # logged once, and the monitor writes nothing more.
        if not self.writes or getattr(self, "write_error", None):
            return
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json_text(finite_or_text(record), indent=None) + "\n")
        except OSError as e:
            self.write_error = e.strerror or str(e)
            logger.warning("gradinit: WARNING: cannot write %s (%s); the monitor writes no more records and "
                           "training goes on. Free space (or fix the permissions) to monitor the next run",
                           self.path, self.write_error)

    # ---- per trainer step ------------------------------------------------------------------
    def on_train_step(self, sample, model, criterion, optimizer, update_num: int, ignore_grad: bool) -> None:
        """Before the forward/backward of a step: on the first one, keep the fixed batch, wrap the
        optimizer's ``clip_grad_norm`` and write the ``start`` record."""
        self.current_update = int(update_num)
        if getattr(vars(optimizer).get("clip_grad_norm"), "watched_by", None) is not self:
            self.watch(optimizer, model)
        if self.writes:
            if self.hooked != id(model):
                self.hook_backward_order(unwrapped(model))
                self.hooked = id(model)
            self.backward_order = {}
            if not ignore_grad:  # fairseq's dummy batches add nothing to the gradients
                self.lengths.append(batch_lengths(sample))
        if self.fixed_batch is None and not ignore_grad and sample:
            self.fixed_batch, self.criterion = sample, criterion
            self.last_update = int(update_num)
            params = list(unwrapped(model).parameters())
            dtype = params[0].dtype if params else torch.float32
            from fairseq.optim.amp_optimizer import AMPOptimizer

            precision = "amp" if isinstance(optimizer, AMPOptimizer) else str(dtype).replace("torch.", "")
            self.precision = precision
            source = training_weights(optimizer, unwrapped(model))[1]
            self.write({"type": "start", "update": int(update_num), "time": int(time.time()), "version": __version__,
                        "interval": self.interval, "precision": precision, "loss_scale": loss_scale(optimizer),
                        "optimizer": type(optimizer).__name__, "weights": source,
                        "fixed_batch": {k: _number(sample.get(k)) for k in ("nsentences", "ntokens")},
                        "cudnn_sdpa_guard": self.sdpa_guard})

    def hook_backward_order(self, model: nn.Module) -> None:
        """A gradient hook on each trainable parameter notes when backward reaches it (a dict entry
        per parameter and backward), so that an overflow record can say where non-finite values began."""
        order = self

        def reached(name):
            def hook(grad):
                order.backward_order.setdefault(name, len(order.backward_order))
            return hook

        for name, p in model.named_parameters():
            if p.requires_grad:
                p.register_hook(reached(name))

    def watch(self, optimizer, model) -> None:
        """Wrap ``optimizer.clip_grad_norm`` (on this instance) so that a non-finite gradient norm is
        examined before fairseq's loss scaler raises and the trainer zeroes the gradients."""
        original = optimizer.clip_grad_norm
        monitor = self

        def clip_grad_norm(max_norm, *args, **kwargs):
            scale = loss_scale(optimizer)
            monitor.attempts += 1
            monitor.attempt_overflowed = False
            try:
                try:
                    norm = original(max_norm, *args, **kwargs)
                except (OverflowError, FloatingPointError) as e:
                    monitor.on_overflow(model, optimizer, scale, None, type(e).__name__)
                    raise
                if not bool(torch.isfinite(torch.as_tensor(norm)).all()):
                    monitor.on_overflow(model, optimizer, scale, norm, None)
                return norm
            finally:
                monitor.lengths = []

        clip_grad_norm.watched_by = monitor
        optimizer.clip_grad_norm = clip_grad_norm

    def on_overflow(self, model, optimizer, scale, norm, error: Optional[str]) -> None:
        self.overflows += 1
        self.attempt_overflowed = True
        if self.overflows_recorded >= MAX_OVERFLOW_RECORDS or not self.writes:
            return
        self.overflows_recorded += 1
        net = unwrapped(model)
        nonfinite = nonfinite_gradients(net, self.backward_order)
        signature = None
        if nonfinite is not None:
            half = self.precision in HALF_PRECISIONS or scale is not None
            params = list(net.parameters())
            device = params[0].device if params else torch.device("cpu")
            signature = known_bug_signature(nonfinite, self.lengths, half, cudnn_attention_affected(
                "fp16" if half else (self.precision or "fp32"), device, self.sdpa_guard))
            del nonfinite["hits"]
        self.write({"type": "overflow", "update": self.current_update, "time": int(time.time()),
                    "loss_scale": scale, "loss_scale_after": loss_scale(optimizer), "error": error,
                    "grad_norm": None if norm is None else float(torch.as_tensor(norm).float().max()),
                    "nonfinite": nonfinite, "lengths": list(self.lengths), "known_bug": signature})

    @contextlib.contextmanager
    def around_optimizer_step(self, optimizer, model, update_num: int):
        """Around ``optimizer.step()``: the step that makes update ``update_num + 1`` a multiple of
        the interval is measured (weights before it, then the record after it)."""
        update = int(update_num) + 1
        due = update % self.interval == 0 and (self.last_update is None or update > self.last_update)
        if not due or not self.writes or self.fixed_batch is None:
            yield
            return
        weights, _ = training_weights(optimizer, unwrapped(model))
        before = [t.detach().clone() for _, t in weights]
        yield
        if self.attempt_overflowed:  # AMP steps through an overflow; its scaler skipped the update
            return
        self.record(update, optimizer, unwrapped(model), [n for n, _ in weights], before,
                    [t for _, t in training_weights(optimizer, unwrapped(model))[0]])

    def record(self, update: int, optimizer, model: nn.Module, names, before, after) -> None:
        groups = group_update_stats(names, before, after)
        norms, losses, attention, branches = self.fixed_batch_stats(model, optimizer)
        advanced = update - (self.last_update if self.last_update is not None else update - 1)
        self.write({"type": "interval", "update": update, "time": int(time.time()), "loss_scale": loss_scale(optimizer),
                    "overflows": self.overflows, "skipped_updates": max(self.attempts - advanced, 0),
                    "overflows_recorded": self.overflows_recorded,
                    "fixed_batch_loss": losses, "eval_train_gap": self.eval_train_gap(update, losses),
                    "groups": groups, "norms": norms, "attention": attention, "branches": branches,
                    "summary": summary_of(groups, norms, attention, branches)})
        self.last_update = update
        self.attempts = self.overflows = self.overflows_recorded = 0

    def eval_train_gap(self, update: int, losses: Dict[str, float]) -> dict:
        """``gap`` eval - train loss on the fixed batch, ``baseline`` the lowest gap of this run's
        earlier records, ``warning`` per :func:`gap_warning` (then also logged)."""
        gap = losses["eval"] - losses["train"]
        warning = gap_warning(gap, self.gap_baseline, self.gap_warned)
        out = {"gap": gap, "baseline": self.gap_baseline, "warning": warning}
        if warning:
            self.gap_warned = gap
            logger.warning("monitor: eval - train loss on the fixed batch rose to %+.3f bits at update %d (lowest "
                           "before: %+.3f): eval mode is breaking away from train mode (docs/monitor.md)",
                           gap, update, self.gap_baseline)
        if math.isfinite(gap):
            self.gap_baseline = gap if self.gap_baseline is None else min(self.gap_baseline, gap)
        return out

    def fixed_batch_stats(self, model: nn.Module, optimizer):
        """``(norms, losses, attention, branches)`` on the fixed batch in eval and in train mode:
        LayerNorm input statistics, the criterion's loss, self-attention entropy and largest logit,
        and branch/residual norm ratios (:mod:`.monitor_stats`). Dropout has a fixed seed, so that
        records compare; the training RNG is left as it was."""
        from fairseq.optim.amp_optimizer import AMPOptimizer

        sample, criterion = self.fixed_batch, self.criterion
        device = next(model.parameters()).device
        amp = isinstance(optimizer, AMPOptimizer)
        norms: Dict[str, dict] = {}
        losses: Dict[str, float] = {}
        attention: Dict[str, dict] = {}
        branches: Dict[str, dict] = {}
        was_training = model.training

        def forward(net):
            with torch.autocast(device.type, enabled=amp):
                loss, sample_size, _ = criterion(net, sample)
            size = float(sample_size) if not torch.is_tensor(sample_size) else float(sample_size.float().item())
            return float(loss.float().item()) / max(size, 1.0) / math.log(2)

        devices = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), norm_statistics_kept(model):
                for mode in ("eval", "train"):
                    model.train(mode == "train")
                    torch.default_generator.manual_seed(self.seed)
                    if devices:
                        torch.cuda.manual_seed(self.seed)
                    box = []
                    with recording_attention(model) as att, recording_branches(model) as res:
                        stats = norm_input_stats(model, lambda net: box.append(forward(net)))
                    losses[mode] = box[0]
                    for name, s in stats.items():
                        norms.setdefault(name, {})[mode] = {"input_std": s.input_std, "gain": s.gain}
                    for name, s in att.items():
                        attention.setdefault(name, {})[mode] = s
                    for layer, ratios in res.items():
                        for branch, r in ratios.items():
                            branches.setdefault(layer, {}).setdefault(branch, {})[mode] = r
        finally:
            model.train(was_training)
        return norms, losses, attention, branches


def _number(value):
    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else None
    return value if isinstance(value, (int, float)) else None
