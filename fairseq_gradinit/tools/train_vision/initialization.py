"""The network and its initialization in ``gradinit-train-vision``: the model, GradInit or MetaInit on
the training data, and the checks of their options before anything is built."""
from __future__ import annotations

from typing import Any, Dict, List

import torch
from torch import nn
from torch.utils.data import DataLoader

from ...core import ConfigError, GradInitConfig, MetaInitConfig
from ...core.config import first_step
from ...core.options import options_of, values_from
from ...core.uses import unstepped_uses_error
from ...vision import create_model, gradinit, metainit
from ...vision.api import CIFAR10, VISION_DIFFERENCES
from .data import Limited
from .errors import UsageError

#: Where this script's defaults depart from the vision API's (:data:`~...vision.api.VISION_DIFFERENCES`),
#: ``field -> (value, reason)``: what the script knows of the training run replaces the API's values.
TRAIN_VISION_DIFFERENCES = {
    **VISION_DIFFERENCES,
    "eta": (None, "the first step is the training's own: --lr"),
    "lr": (None, "the paper's best tau for the network (PAPER_TAU), else 1e-2"),
    "iters": (None, "one pass over the training data the script loads"),
    "batch_size": (None, "--gradinit-batch-size, else the training's --batch-size"),
}
#: The script's options and their defaults: the CIFAR-10 recipe with :data:`TRAIN_VISION_DIFFERENCES`.
GRADINIT_CLI_OPTIONS = tuple(options_of(GradInitConfig, python_only=False, defaults=CIFAR10.defaults(
    TRAIN_VISION_DIFFERENCES, texts={
        "eta": "--lr",
        "lr": "the paper's best tau for the network, else 1e-2; MetaInit's too unless --metainit-lr",
        "iters": "one pass over the training data",
        "scale_grad_clip": "1.0; 0 turns it off; MetaInit's too",
    })))
INITS = ("kaiming", "gradinit", "metainit", "warmup1", "const1")
#: Best tau (GradInit's scale learning rate) per network from the paper's Appendix A; WRN-28-10
#: from the authors' launch script. Other networks fall back to 1e-2.
PAPER_TAU = {
    ("vgg19", False): 1e-2, ("vgg19", True): 1e-1,
    ("resnet110", False): 5e-2, ("resnet110", True): 5e-3,
    ("fixup_resnet110", False): 2e-2,
    ("densenet100", False): 5e-3, ("densenet100", True): 1e-2,
    ("wrn_28_10", True): 3e-3,
}
DEFAULT_TAU = 1e-2


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def build_model(args, *, num_classes: int, in_channels: int, device: torch.device) -> nn.Module:
    """The registered network of ``--model`` with ``--bn``/``--width``/``--fixup-init`` applied."""
    kwargs: Dict[str, Any] = dict(num_classes=num_classes, in_channels=in_channels, width=args.width)
    if args.bn is not None:
        kwargs["bn"] = args.bn
    if args.model.startswith("fixup"):
        fixup = args.fixup_init if args.fixup_init is not None else args.init not in ("gradinit", "metainit")
        kwargs["fixup_init"] = fixup
    elif args.fixup_init is not None:
        raise UsageError("--fixup-init/--no-fixup-init only apply to fixup_* models")
    return create_model(args.model, **kwargs).to(device)


def paper_tau(model_name: str, bn: bool) -> float:
    return PAPER_TAU.get((model_name, bool(bn)), DEFAULT_TAU)


def run_initialization(args, model, train_set, device, in_bn: bool, progress: bool) -> Dict[str, Any]:
    """GradInit or MetaInit on the training data; returns the log entry."""
    tau = paper_tau(args.model, in_bn)
    gen = torch.Generator().manual_seed(args.seed + 10_000)
    if args.init == "gradinit":
        bs = args.gradinit_batch_size or args.batch_size
        loader = DataLoader(train_set, batch_size=bs, shuffle=True, drop_last=True, num_workers=args.workers,
                            generator=gen, pin_memory=device.type == "cuda")
        lr = args.gradinit_lr if args.gradinit_lr is not None else tau
        options = values_from(args, GRADINIT_CLI_OPTIONS, prefix="gradinit_")
        options.update(eta=first_step(options["optimizer"], args.lr, eta=options["eta"]).eta, lr=lr,
                       scale_grad_clip=options["scale_grad_clip"] or None)
        res = gradinit(model, Limited(loader, args.limit_train_batches), device=device, progress=progress, **options)
        info = res.to_dict()
        info.update(method="gradinit", tau=lr, batch_size=bs)
        return info
    bs = args.metainit_batch_size or args.batch_size
    loader = DataLoader(train_set, batch_size=bs, shuffle=True, drop_last=True, num_workers=args.workers,
                        generator=gen, pin_memory=device.type == "cuda")
    lr = args.metainit_lr if args.metainit_lr is not None else (
        args.gradinit_lr if args.gradinit_lr is not None else tau)
    res = metainit(model, Limited(loader, args.limit_train_batches), lr=lr, iters=args.metainit_iters,
                   eps=args.metainit_eps, min_scale=args.gradinit_min_scale, max_scale=args.gradinit_max_scale,
                   scale_grad_clip=args.gradinit_scale_grad_clip or None, device=device, progress=progress)
    info = res.to_dict()
    info.update(method="metainit", lr=lr, batch_size=bs)
    return info


#: The flags of train_vision.py's own initialization options and their defaults (the others are
#: GRADINIT_CLI_OPTIONS).
OWN_INIT_DEFAULTS = {"gradinit_batch_size": None, "metainit_lr": None, "metainit_iters": None, "metainit_eps": 1e-5,
                     "metainit_batch_size": None}
#: MetaInit reads these GradInit flags (its scale bounds and gradient clip, and tau as its default lr).
METAINIT_SHARED = ("gradinit_lr", "gradinit_min_scale", "gradinit_max_scale", "gradinit_scale_grad_clip")
#: The prefix of the flags of each engine config's fields.
_FLAG_PREFIX = {"GradInitConfig": "gradinit", "MetaInitConfig": "metainit"}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_init_options(args) -> List[str]:
    """Check every --gradinit-*/--metainit-* value with the ranges of GradInitConfig/MetaInitConfig
    before anything is built (:class:`UsageError`, worded as argparse words its errors); returns the
    flags given that ``--init`` does not use, for a warning."""
    gi_lr = args.gradinit_lr if args.gradinit_lr is not None else DEFAULT_TAU
    eta_from_lr = getattr(args, "gradinit_eta", None) is None
    try:
        options = values_from(args, GRADINIT_CLI_OPTIONS, prefix="gradinit_")
        eta = options["eta"]
        if eta is None:  # --lr is GradInit's eta only when GradInit runs
            eta = first_step(options["optimizer"], args.lr).eta if args.init == "gradinit" else GradInitConfig.eta
        options.update(eta=eta, lr=gi_lr, scale_grad_clip=options["scale_grad_clip"] or None)
        GradInitConfig(**options)
        MetaInitConfig(lr=args.metainit_lr if args.metainit_lr is not None else gi_lr, iters=args.metainit_iters,
                       eps=args.metainit_eps, min_scale=options["min_scale"], max_scale=options["max_scale"],
                       scale_grad_clip=options["scale_grad_clip"])
    except ConfigError as e:
        if e.owner not in _FLAG_PREFIX:
            raise UsageError(str(e)) from None
        flag = f"--{_FLAG_PREFIX[e.owner]}-{e.field.replace('_', '-')}"
        if e.owner == "GradInitConfig" and e.field == "eta" and eta_from_lr:
            flag = "--lr (the default of --gradinit-eta)"
        raise UsageError(f"argument {flag}: invalid value {e.value!r}: expected {e.expected}") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    defaults = {f"gradinit_{spec.name}": spec.default for spec in GRADINIT_CLI_OPTIONS if not spec.python_only}
    defaults.update(OWN_INIT_DEFAULTS)
    used = {"gradinit": {d for d in defaults if d.startswith("gradinit_")},
            "metainit": {d for d in defaults if d.startswith("metainit_")} | set(METAINIT_SHARED)}.get(args.init, set())
    return [f"{_flag(d)} {getattr(args, d)}" for d, default in defaults.items()
            if d not in used and getattr(args, d, default) != default]


def check_model_options(args, model: nn.Module, resume: str) -> None:
    """Refuse options that need the built model to be checked, before the initialization runs: an
    ``--gradinit-unstepped-uses`` pattern that names none of the model's parameter uses."""
    if args.init == "gradinit" and not resume:
        error = unstepped_uses_error(model, args.gradinit_unstepped_uses, label="argument --gradinit-unstepped-uses: ")
        if error is not None:
            raise UsageError(error)


def check_batches(args, n_train: int, resume: str) -> None:
    """Refuse batch settings that give the training loop or the initialization too few batches."""
    limit = args.limit_train_batches
    if args.batch_size > n_train:
        raise UsageError(f"--batch-size {args.batch_size} is larger than the training set ({n_train} images); "
                         "lower --batch-size")
    if resume or args.init not in ("gradinit", "metainit"):
        return
    flag = f"--{args.init}-batch-size"
    bs = getattr(args, f"{args.init}_batch_size") or args.batch_size
    iters = getattr(args, f"{args.init}_iters")
    n = n_train // bs  # its loader drops the last, partial batch
    where = f"{flag} {bs}" if getattr(args, f"{args.init}_batch_size") else f"--batch-size {bs}"
    if n == 0:
        raise UsageError(f"{where} is larger than the training set ({n_train} images); lower it")
    if limit is not None:
        n = min(n, limit)
    need = 2 if args.init == "gradinit" and iters is None and args.gradinit_overlap < 1.0 else 1
    if n < need:
        src = f"--limit-train-batches {limit}" if limit is not None and limit < n_train // bs else \
            f"{where} on {n_train} images"
        raise UsageError(f"GradInit pairs consecutive batches and needs at least 2 per pass, but {src} gives "
                         f"{n}: raise --limit-train-batches, lower {flag} or --batch-size, or set --gradinit-iters "
                         "to cycle the batches")
