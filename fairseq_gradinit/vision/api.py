"""One-call GradInit and MetaInit for image classifiers (any ``nn.Module``).

Both functions are thin wrappers around the pure-PyTorch engine in :mod:`fairseq_gradinit.core`:
they build its configuration from keyword options, move batches to the model's device, supply a
cross-entropy loss for ``(input, target)`` batches and show a progress bar.
"""
from __future__ import annotations

import collections.abc
import contextlib
import logging
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..core import GradInitConfig, GradInitResult, MetaInitConfig, MetaInitResult, unwrap_model
from ..core import gradinit as core_gradinit
from ..core import metainit as core_metainit
from ..core.health import scale_health, snapshot_weights
from ..core.options import options_of
from ..core.recipes import recipe
from ..core.runtime import LossFn

logger = logging.getLogger(__name__)

Device = Union[str, torch.device, None]
#: The paper's CIFAR-10 recipe, whose values are the vision API's defaults.
CIFAR10 = recipe("paper-cifar10")


def classification_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Mean cross-entropy of ``model(input)`` against ``target`` for a batch ``(input, target, ...)``
    or ``{"input": ..., "target": ...}`` (also ``"image"``/``"label"``)."""
    if isinstance(batch, dict):
        x = batch.get("input", batch.get("image"))
        y = batch.get("target", batch.get("label"))
    elif isinstance(batch, (list, tuple)) and len(batch) >= 2:
        x, y = batch[0], batch[1]
    else:
        x = y = None
    if x is None or y is None:
        raise ValueError(
            "the default loss expects (input, target) batches, as a torchvision DataLoader yields; "
            f"got {type(batch).__name__}. Pass loss_fn=lambda model, batch: ... for other batches")
    try:
        out = model(x)
    except RuntimeError as e:
        # Raw uint8 images reach the first layer as they are and fail with torch's dtype error.
        if isinstance(x, torch.Tensor) and x.dtype == torch.uint8:
            raise ValueError(
                "the loader yields uint8 images, which the model cannot take; convert them to float in the "
                "dataset (e.g. torchvision.transforms.ToTensor(), or x.float() / 255 and your normalization)"
            ) from e
        raise
    return F.cross_entropy(out, y)


def check_precision(model: nn.Module) -> None:
    """Refuse a model with half-precision (fp16/bf16) parameters, as the fairseq plugin does."""
    if not isinstance(model, nn.Module):
        return  # the engine refuses it with its own message
    for name, p in unwrap_model(model).named_parameters():
        if p.dtype in (torch.float16, torch.bfloat16):
            raise ValueError(
                f"GradInit runs on a float32 (or float64) model, but {name!r} is {p.dtype}: its forward pass "
                "can overflow at initialization, which no setting of GradInit fixes. Run GradInit before "
                "converting the model (model.float(), GradInit, then model.half()), or train in fp32 with autocast")


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter (or buffer); CPU for a model without tensors."""
    inner = unwrap_model(model)
    for t in inner.parameters():
        return t.device
    for t in inner.buffers():
        return t.device
    return torch.device("cpu")


def to_device(batch: Any, device: Union[str, torch.device]) -> Any:
    """``batch`` with every tensor moved to ``device`` (nested tuples, lists, dicts, namedtuples)."""
    device = torch.device(device)
    if isinstance(batch, torch.Tensor):
        # non_blocking only host -> CUDA (pinned memory); a copy to the host must be synchronous
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return type(batch)((k, to_device(v, device)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


class DeviceLoader:
    """Re-iterable view of ``loader`` whose batches are moved to ``device``.

    Re-iterable, so the engine can cycle it when asked for more iterations than one pass has.
    """

    def __init__(self, loader: Iterable[Any], device: torch.device):
        self.loader, self.device = loader, device

    def __iter__(self) -> Iterator[Any]:
        for b in self.loader:
            yield to_device(b, self.device)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


class LastBatch:
    """``batches`` as they are (re-iterable or one-shot), remembering the last batch drawn."""

    def __init__(self, batches: Iterable[Any]):
        self.batches, self.last = batches, None
        self._one_shot = _one_shot(batches)

    def __iter__(self) -> Iterator[Any]:
        # A one-shot input stays one-shot: the engine cycles only what iter() does not return as is.
        return self if self._one_shot else self._remember(iter(self.batches))

    def _remember(self, it: Iterator[Any]) -> Iterator[Any]:
        for b in it:
            self.last = b
            yield b

    def __next__(self) -> Any:
        self.last = next(self.batches)  # type: ignore[call-overload]
        return self.last

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]


def _resolve_device(model: nn.Module, device: Device) -> torch.device:
    here = model_device(model)
    if device is None:
        return here
    dev = torch.device(device)
    if dev.type != here.type or (dev.index is not None and here.index is not None and dev.index != here.index):
        raise ValueError(f"device={str(dev)!r} but the model's parameters are on {here}; move the model "
                         "first (model.to(device)) or leave device=None to use the model's device")
    return dev


def _loader_len(loader: Any) -> Optional[int]:
    try:
        return len(loader)
    except TypeError:
        return None


def _progress_bar(total: Optional[int], enabled: bool, desc: str):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bars are optional
        logger.info("tqdm is not installed: no progress bar")
        return None
    return tqdm(total=total, desc=desc, unit="it", dynamic_ncols=True, leave=False)


def _one_shot(loader: Any) -> bool:
    """True for an iterator (a generator...), which can be consumed only once."""
    return isinstance(loader, collections.abc.Iterator)


def _batches(loader: Iterable[Any], dev: torch.device) -> Iterable[Any]:
    # A one-shot iterator must stay one-shot for the engine (it cycles re-iterable inputs only).
    if _one_shot(loader):
        return (to_device(b, dev) for b in loader)
    return DeviceLoader(loader, dev)


#: Where the vision API's defaults depart from the paper's CIFAR-10 recipe (:data:`CIFAR10`: SGD at
#: learning rate 0.1, A[g] = gamma g/||g||_2 as the authors' CIFAR scripts, Adam with default betas on the
#: scales, the scale gradient clipped at 1), ``field -> (value, reason)``; every other value is the recipe's.
VISION_DIFFERENCES = {
    "iters": (None, "one pass over the loader the caller hands in, whatever its batch size (the recipe's 390 "
                    "iterations are one epoch of its 128-image batches)"),
    "gamma": (None, "the rule of thumb eta*gamma^2 = 0.1 (first_step) follows an eta the caller changes; at the "
                    "recipe's eta 0.1 it gives the recipe's gamma 1"),
    "batch_size": (None, "the batches are the loader's"),
}
#: How the options' help states the vision API's defaults, where the value alone does not.
VISION_DEFAULT_TEXTS = {
    "lr": "1e-2; the paper searches 1e-3 .. 1e-1",
    "iters": "None, one pass over the loader (len(loader) - 1 iterations); a larger number cycles a re-iterable "
             "loader",
}
#: The vision API's defaults where they differ from the engine's: :data:`CIFAR10` with :data:`VISION_DIFFERENCES`.
VISION_DEFAULTS = CIFAR10.defaults(VISION_DIFFERENCES, texts=VISION_DEFAULT_TEXTS)
#: The keyword options of :func:`gradinit` besides its own arguments (all of GradInitConfig's).
GRADINIT_OPTIONS = {s.name: s for s in options_of(GradInitConfig, defaults=VISION_DEFAULTS)}
# gradinit()'s signature names every option and reads its default here, so that each is declared once
# (help(gradinit) shows the values).
_D = {name: spec.default for name, spec in GRADINIT_OPTIONS.items()}


def gradinit(
    model: nn.Module, loader: Iterable[Any], config: Optional[GradInitConfig] = None, *,
    loss_fn: Optional[LossFn] = None, device: Device = None, progress: bool = True, process_group=None,
    callback: Optional[Callable[[Any], None]] = None,
    optimizer: str = _D["optimizer"], eta: float = _D["eta"], gamma: Optional[float] = _D["gamma"],
    lr: float = _D["lr"], betas: Tuple[float, float] = _D["betas"], eps: float = _D["eps"],
    iters: Optional[int] = _D["iters"], min_scale: float = _D["min_scale"], max_scale: Optional[float] = _D["max_scale"],
    gamma_init_factor: Optional[float] = _D["gamma_init_factor"], overlap: float = _D["overlap"],
    pairs: str = _D["pairs"], adam_state: str = _D["adam_state"], scale_grad_clip: Optional[float] = _D["scale_grad_clip"],
    sgd_step: str = _D["sgd_step"], reuse_graph: bool = _D["reuse_graph"], constraint_grad: str = _D["constraint_grad"],
    fd_eps: float = _D["fd_eps"], max_consecutive_skips: int = _D["max_consecutive_skips"],
    log_interval: int = _D["log_interval"], log_seconds: float = _D["log_seconds"],
    scale_bounds: Sequence[Any] = _D["scale_bounds"], step_params: str = _D["step_params"],
    max_step_ratio: Optional[float] = _D["max_step_ratio"], lookahead_steps: int = _D["lookahead_steps"],
    lookahead_betas: Tuple[float, float] = _D["lookahead_betas"], loss_ceiling: Optional[float] = _D["loss_ceiling"],
    dropout: bool = _D["dropout"],
    unstepped_uses: Optional[str] = _D["unstepped_uses"],
    fixed_params: Optional[Callable[[str, nn.Parameter], bool]] = _D["fixed_params"],
    precision: str = _D["precision"], param_filter: Optional[Callable[[str, nn.Parameter], bool]] = _D["param_filter"],
) -> GradInitResult:
    """Initialize ``model`` with GradInit on the batches of ``loader`` (in place).

    Args:
        model: any ``nn.Module``, also DataParallel/DDP-wrapped. BatchNorm layers use batch
            statistics during GradInit; their running statistics are left untouched.
        loader: an iterable of batches, e.g. a ``DataLoader`` of ``(input, target)``. Consecutive
            batches b_t, b_{t+1} form S = b_t and S~ = last ``overlap`` part of b_t + first part of
            b_{t+1}, so S and S~ both have the loader's batch size; with ``pairs="authors"`` each
            batch gives one pair, its first and its last two thirds.
        config: a :class:`~fairseq_gradinit.core.GradInitConfig` used as it is, e.g.
            ``recipe("paper-cifar10").config()`` (:mod:`fairseq_gradinit.core.recipes`); the options
            below then stay at their defaults (``ValueError`` otherwise: set them on the config).
        loss_fn: ``loss_fn(model, batch) -> mean loss``; default: cross-entropy on ``(input, target)``.
        device: where batches go; default the model's device (the model is not moved).
        progress: show a tqdm progress bar.
        process_group: data-parallel group (each rank passes its own shard of the data).
        callback: called with each :class:`~fairseq_gradinit.core.IterationRecord`.

    Options (the fields of :class:`~fairseq_gradinit.core.GradInitConfig`, whose help describes each;
    ``docs/options.md`` lists them). The defaults are the paper's CIFAR-10 recipe: the model will be
    trained with SGD at learning rate ``eta=0.1``, gamma from the rule of thumb eta * gamma^2 = 0.1
    (gamma = 1), SGD's first step A[g] = gamma g / ||g||_2 (Sec. 3.1), Adam with default betas on the
    scales, lower bound 0.01, ``|S ∩ S~| = |S| / 2``, one pass over the loader:
        optimizer, eta, gamma, gamma_init_factor, sgd_step: the first training step GradInit prepares;
            lookahead_steps, lookahead_betas: how many steps of it the objective simulates (Adam only).
        lr, betas, eps, scale_grad_clip, adam_state: the Adam optimizer of the scales (lr is tau).
        iters, overlap, pairs: the iterations and how S and S~ are drawn.
        min_scale, max_scale, scale_bounds, max_step_ratio, loss_ceiling: bounds of the scales (loss_ceiling:
            of the loss they may cost at the init).
        step_params, unstepped_uses, fixed_params, param_filter: which tensors are scaled and stepped.
        constraint_grad, fd_eps, reuse_graph, precision, dropout: how the passes are computed.
        max_consecutive_skips, log_interval, log_seconds: run controls.

    Returns:
        :class:`~fairseq_gradinit.core.GradInitResult` with ``scales`` (name -> float),
        ``history``, ``wall_time`` and ``health``: the health check of the scales
        (:class:`~fairseq_gradinit.core.health.ScaleHealth`, logged as a warning when degenerate).
    """
    options = {name: value for name, value in locals().items() if name in GRADINIT_OPTIONS}
    return _run_gradinit(model, loader, _config(config, options), loss_fn=loss_fn, device=device,
                         progress=progress, process_group=process_group, callback=callback)


def _config(config: Optional[GradInitConfig], options: dict) -> GradInitConfig:
    """``config`` as it is, or a new one of the keyword ``options``."""
    if config is None:
        return GradInitConfig(**options)
    if not isinstance(config, GradInitConfig):
        raise TypeError(f"config must be a GradInitConfig or None, got {type(config).__name__}")
    changed = [n for n, v in options.items() if v is not GRADINIT_OPTIONS[n].default
               and v != GRADINIT_OPTIONS[n].default]
    if changed:
        raise ValueError(f"gradinit() got a config and the options {changed}: set them on the config instead, "
                         f"e.g. dataclasses.replace(config, {changed[0]}=...)")
    return config


def _run_gradinit(model, loader, config: GradInitConfig, *, loss_fn, device, progress, process_group,
                  callback) -> GradInitResult:
    """GradInit of :func:`gradinit` with its config resolved: batches to the device, progress, health."""
    iters = config.iters
    overlap = 1.0 if config.pairs == "authors" else config.overlap  # authors: one pair per batch
    check_precision(model)
    dev = _resolve_device(model, device)
    if iters is None and not _one_shot(loader):
        n = _loader_len(loader)
        if n is not None and n < 2 and overlap < 1.0:
            raise ValueError(f"the loader has {n} batch(es): GradInit pairs consecutive batches and needs at "
                             "least 2 (lower the batch size or pass iters=... to cycle it)")
    total = iters
    if total is None:
        n = _loader_len(loader)
        if n is not None:
            total = n if overlap >= 1.0 else max(n - 1, 0)
    loss = loss_fn or classification_loss
    initial = snapshot_weights(model)  # the weights before the scales, for the health check
    batches = LastBatch(_batches(loader, dev))
    result = _with_progress(
        "GradInit", total, progress, callback,
        lambda rec: f"{rec.branch} L(S)={rec.loss_s if rec.loss_s is None else round(rec.loss_s, 4)}",
        lambda on_record: core_gradinit(model, batches, loss, config,
                                        process_group=process_group, callback=on_record))
    if batches.last is not None:
        result.health = scale_health(model, result.scales, lambda m: loss(m, batches.last), initial=initial,
                                     config=config, loss=lambda m: loss(m, batches.last), history=result.history,
                                     gamma=result.gamma)
        log = logger.info if result.health.ok else logger.warning
        for line in result.health.table():
            log("gradinit: %s", line)
    return result


def metainit(
    model: nn.Module,
    loader: Iterable[Any],
    *,
    lr: float = 1e-2,
    iters: Optional[int] = None,
    eps: float = 1e-5,
    betas: Tuple[float, float] = (0.9, 0.999),
    min_scale: float = 0.01,
    max_scale: Optional[float] = None,
    scale_grad_clip: Optional[float] = 1.0,
    loss_fn: Optional[LossFn] = None,
    device: Device = None,
    progress: bool = True,
    param_filter: Optional[Callable[[str, nn.Parameter], bool]] = None,
    process_group=None,
    callback: Optional[Callable[[Any], None]] = None,
    log_interval: int = 50,
) -> MetaInitResult:
    """Initialize ``model`` with MetaInit (the GradInit paper's improved version: real data, Adam
    on the weight norms with the same clipping and lower bound as GradInit), in place.

    Args:
        lr: learning rate of Adam on the per-tensor scales (norm_i = scale_i * initial norm_i).
        iters: number of iterations (one batch each); ``None`` is one pass over ``loader``.
        eps: eps of the gradient quotient's denominator.
        Other arguments as in :func:`gradinit`.

    Returns:
        :class:`~fairseq_gradinit.core.MetaInitResult` with ``scales``, ``norms``,
        ``initial_norms`` and ``history``.
    """
    config = MetaInitConfig(lr=lr, betas=tuple(betas), eps=eps, iters=iters, min_scale=min_scale,
                            max_scale=max_scale, scale_grad_clip=scale_grad_clip, log_interval=log_interval,
                            param_filter=param_filter)
    check_precision(model)
    dev = _resolve_device(model, device)
    total = iters if iters is not None else _loader_len(loader)
    return _with_progress(
        "MetaInit", total, progress, callback,
        lambda rec: f"GQ={rec.gq if rec.gq is None else round(rec.gq, 4)}",
        lambda on_record: core_metainit(model, _batches(loader, dev), loss_fn or classification_loss, config,
                                        process_group=process_group, callback=on_record))


def _with_progress(desc: str, total: Optional[int], progress: bool, callback: Optional[Callable[[Any], None]],
                   postfix: Callable[[Any], str], run: Callable[[Callable[[Any], None]], Any]) -> Any:
    """``run(on_record)`` with a tqdm bar advanced by every record (and ``callback`` called)."""
    bar = _progress_bar(total, progress, desc)

    def on_record(rec):
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(postfix(rec), refresh=False)
        if callback is not None:
            callback(rec)

    try:
        with _log_above(bar):
            return run(on_record)
    finally:
        if bar is not None:
            bar.close()


def _log_above(bar) -> contextlib.AbstractContextManager:
    """While ``bar`` is shown, the root logger's console lines are written above it, not onto its line."""
    if bar is None:
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm(tqdm_class=type(bar))
