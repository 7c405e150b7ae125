#!/usr/bin/env python
"""Train an image classifier from the GradInit paper's CIFAR recipe, with GradInit, MetaInit or the
paper's baselines as initialization.

Recipe (paper, Sec. 4.1 and Appendix A): SGD with momentum 0.9, learning rate 0.1, weight decay
1e-4, cosine annealing per iteration to 0, 200 epochs, batch size 128 (64 for DenseNet), random
crop + horizontal flip + cutout, gradient clipping at norm 1 for networks without BN.

    gradinit-train-vision --dataset cifar10 --model resnet110 --no-bn --init gradinit

Every epoch writes ``log.json``, ``log.csv`` and ``checkpoint.pt`` to ``--output-dir``;
``--resume auto`` continues from that checkpoint. A folder that holds a run is never written into
without ``--resume`` or ``--overwrite``. Mistakes end in one ``error:`` line (exit status 2 for a bad
argument, 1 for other failures, 130 for Ctrl-C).
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from ...command_line.argtypes import float_in, int_at_least, positive_int
from ...command_line.option_forms import add_arguments
from ...command_line.quiet import quiet_command
from ...core.progress import format_duration
from ...files import paths
from ...files.locks import FolderBusy, folder_lock, lock_path
from ...files.paths import FOLDER, MARKER, OutputError, check_output
from ...vision import list_models
from .data import DATASETS, Limited, build_datasets
from .errors import Interrupted, RunFailure, UsageError
from .initialization import (
    GRADINIT_CLI_OPTIONS,
    INITS,
    build_model,
    check_batches,
    check_init_options,
    check_model_options,
    has_batchnorm,
    run_initialization,
)
from .loop import RUN_FILES, check_output_dir, default_output_dir, load_checkpoint, set_rng_state, train_epochs

logger = logging.getLogger("train_vision")
COMMAND = "gradinit-train-vision"
#: The seeds every generator the run seeds accepts (numpy's are 32-bit).
SEED_RANGE = (0, 2 ** 32 - 1)




# ----------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------
def seed(text: str) -> int:
    """An argparse type: a seed that Python's, numpy's and torch's generators all accept."""
    low, high = SEED_RANGE
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer in [{low}, {high}]")
    return value


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train a CIFAR-style classifier with GradInit / MetaInit / "
                                "baseline initializations (the GradInit paper's recipe).", add_help=add_help,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_and_data_arguments(p)
    add_training_arguments(p)
    return p


def add_model_and_data_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="resnet110", choices=list_models(), help="registered architecture")
    g.add_argument("--bn", default=None, action=argparse.BooleanOptionalAction,
                   help="with or without BN layers (without: learnable biases instead); default: the "
                   "model's default (BN, except fixup_resnet110)")
    g.add_argument("--width", default=1.0, type=float_in(0.0, low_open=True), help="channel-width multiplier (1.0 = the paper's network; "
                   "e.g. 0.25 for quick CPU runs)")
    g.add_argument("--fixup-init", default=None, action=argparse.BooleanOptionalAction,
                   help="fixup_resnet110 only: FixUp's zero initialization (default) or, with --no-fixup-init, "
                   "Kaiming for every layer; default: FixUp init for --init kaiming/warmup1/const1 and Kaiming "
                   "for gradinit/metainit, as in the paper")

    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="cifar10", choices=DATASETS, help="training data")
    g.add_argument("--data-dir", default="data", help="cifar10: download/cache folder; fashion-mnist: folder with "
                   "the four idx(.gz) files (default: the Debian package's /usr/share/datasets/fashion-mnist); "
                   "imagefolder: folder with train/ and val/ (or test/) subfolders")
    g.add_argument("--download", default=True, action=argparse.BooleanOptionalAction,
                   help="cifar10: download the data if it is not in --data-dir")
    g.add_argument("--image-size", default=32, type=positive_int, help="imagefolder: side of the (square) training images")
    g.add_argument("--synthetic-train-size", default=512, type=positive_int, help="synthetic: number of training images")
    g.add_argument("--synthetic-test-size", default=128, type=positive_int, help="synthetic: number of test images")
    g.add_argument("--synthetic-shape", default="1,28,28", help="synthetic: image shape C,H,W (1,28,28 is "
                   "Fashion-MNIST's shape)")
    g.add_argument("--synthetic-classes", default=10, type=positive_int, help="synthetic: number of classes")
    g.add_argument("--augment", default=True, action=argparse.BooleanOptionalAction,
                   help="random crop (padding 4) + horizontal flip + cutout on training images")
    g.add_argument("--cutout-length", default=None, type=int_at_least(0), help="side of the cutout square (default: half "
                   "the image side, 16 for CIFAR; 0 disables cutout)")
    g.add_argument("--workers", default=2, type=int_at_least(0), help="DataLoader worker processes")


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--epochs", default=200, type=positive_int,
                   help="epochs of the cosine schedule (warmup1/const1 add one)")
    g.add_argument("--batch-size", default=None, type=positive_int,
                   help="training batch size (default: 128, 64 for densenet100)")
    g.add_argument("--test-batch-size", default=256, type=positive_int, help="evaluation batch size")
    g.add_argument("--lr", default=0.1, type=float_in(0.0), help="base learning rate of SGD")
    g.add_argument("--momentum", default=0.9, type=float_in(0.0, 1.0), help="SGD momentum")
    g.add_argument("--wd", "--weight-decay", dest="wd", default=1e-4, type=float_in(0.0), help="weight decay")
    g.add_argument("--clip-grad-norm", default=None, type=float_in(0.0), help="clip the gradient norm during training "
                   "(default: 1 for networks without BN, off otherwise; 0 turns it off)")
    g.add_argument("--limit-train-batches", default=None, type=positive_int, help="use at most this many batches per "
                   "epoch (also bounds the GradInit/MetaInit pass); for quick runs")
    g.add_argument("--limit-test-batches", default=None, type=positive_int,
                   help="evaluate on at most this many batches")
    g.add_argument("--seed", default=0, type=seed, help="random seed")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--threads", default=None, type=positive_int, help="torch.set_num_threads for CPU runs")
    g.add_argument("--log-interval", default=50, type=int_at_least(0),
                   help="log training progress every N batches (0: never)")

    g = p.add_argument_group("initialization")
    g.add_argument("--init", default="kaiming", choices=INITS, help="kaiming: the architecture's initialization; "
                   "gradinit / metainit: run it on the training data first; warmup1: one extra epoch with a "
                   "linear learning-rate warmup; const1: one extra epoch at the constant base learning rate")
    add_arguments(g, GRADINIT_CLI_OPTIONS)
    g.add_argument("--gradinit-batch-size", default=None, type=positive_int, help="batch size of S and S~ (default: "
                   "--batch-size)")
    g.add_argument("--metainit-lr", default=None, type=float, help="MetaInit: Adam's learning rate on the "
                   "norms (default: as --gradinit-lr)")
    g.add_argument("--metainit-iters", default=None, type=int, help="MetaInit iterations (default: one pass)")
    g.add_argument("--metainit-eps", default=1e-5, type=float, help="MetaInit: eps of the gradient quotient")
    g.add_argument("--metainit-batch-size", default=None, type=positive_int, help="MetaInit batch size (default: "
                   "--batch-size)")
    g.add_argument("--progress", default=None, action=argparse.BooleanOptionalAction,
                   help="progress bars for GradInit/MetaInit (default: when stderr is a terminal)")

    g = p.add_argument_group("output")
    g.add_argument("--output-dir", default=None, help="where log.json, log.csv and checkpoint.pt go (default: "
                   "runs/<dataset>-<model>-<bn|nobn>-w<width>-<init>-lr<lr>-e<epochs>-wd<wd>-b<batch size>-s<seed>, "
                   "plus -tau<tau> when --gradinit-lr/--metainit-lr is given and -l<n> with --limit-train-batches); "
                   "a folder that holds a run is refused unless --resume or --overwrite is given")
    g.add_argument("--resume", default="", help="checkpoint to resume from, or 'auto' for "
                   "<output-dir>/checkpoint.pt (a missing file with 'auto' starts a new run)")
    g.add_argument("--overwrite", action="store_true", help="start a new run in an --output-dir that holds "
                   "one; its checkpoint.pt, log.json and log.csv are replaced when the new run's first epoch ends")


def main(args, *, command: str = COMMAND) -> Dict[str, Any]:
    """Train as ``args`` (from :func:`get_args_parser`) say; returns the run's log, marked as written by
    ``command``. Mistakes raise :class:`UsageError` or :class:`RunFailure`, Ctrl-C during training
    :class:`Interrupted`. The output folder is locked for the whole run: a second run into it while this
    one runs is refused (:class:`RunFailure`)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    warn_unused(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.batch_size is None:
        args.batch_size = 64 if args.model.startswith("densenet") else 128
    out_dir = Path(args.output_dir or default_output_dir(args))
    problem = name_too_long("--output-dir", out_dir, locked=True)
    if problem:
        raise UsageError(problem)
    check_output_dir(out_dir, resume=args.resume, overwrite=args.overwrite)
    try:  # before any data is loaded: a folder written only when the first epoch ends must be writable
        check_output("--output-dir", out_dir, FOLDER, inputs={"--data-dir": args.data_dir},
                     writes=RUN_FILES)
    except OutputError as e:
        raise UsageError(str(e)) from None
    try:
        with folder_lock(out_dir, flag="--output-dir", command=command):
            return train_run(args, out_dir, device, command)
    except FolderBusy as e:
        raise RunFailure(str(e)) from None


def resolve_device(text: Optional[str]) -> torch.device:
    """``--device`` as a torch device (default: cuda if available, else cpu); :class:`UsageError` for a
    name torch does not know or an accelerator this machine does not have, before anything is built."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"argument --device: invalid value {text!r}: expected a torch device such as cpu, cuda "
                         "or cuda:1") from None
    backend = getattr(torch, device.type, None) if device.type not in ("cpu", "meta") else None
    count = backend.device_count() if callable(getattr(backend, "device_count", None)) else None
    if count == 0:
        raise UsageError(f"argument --device: {text}: this machine has no {device.type.upper()} device that torch can "
                         f"use; use --device cpu, or leave --device out to take a GPU when there is one")
    if count is not None and device.index is not None and device.index >= count:
        raise UsageError(f"argument --device: {text}: this machine has {count} {device.type.upper()} device(s), "
                         f"{device.type}:0 to {device.type}:{count - 1}; pick one of them")
    return device


def name_too_long(flag: str, path: os.PathLike, *, locked: bool = False) -> Optional[str]:
    """:func:`~fairseq_gradinit.files.paths.name_too_long`, with ``locked`` also the name of the folder's lock
    file beside it."""
    also = [(os.path.basename(lock_path(os.path.abspath(os.fspath(path)))), "the name of its lock file beside it")]
    return paths.name_too_long(flag, path, also=also if locked else ())


def train_run(args, out_dir: Path, device: torch.device, command: str) -> Dict[str, Any]:
    """:func:`main` once ``out_dir`` is locked (its check again: another run may have written it meanwhile)."""
    resume = check_output_dir(out_dir, resume=args.resume, overwrite=args.overwrite)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    train_set, test_set, num_classes, in_channels, side = load_data(args)
    check_batches(args, len(train_set), resume)
    model = build_model(args, num_classes=num_classes, in_channels=in_channels, device=device)
    check_model_options(args, model, resume)
    uses_bn = has_batchnorm(model)
    clip = args.clip_grad_norm if args.clip_grad_norm is not None else (0.0 if uses_bn else 1.0)
    num_params = sum(p.numel() for p in model.parameters())
    logger.info("%s (%s BN, width %g): %.2fM parameters; %d classes, %d input channel(s), %dpx images",
                args.model, "with" if uses_bn else "without", args.width, num_params / 1e6, num_classes,
                in_channels, side)

    gen = torch.Generator().manual_seed(args.seed)
    train_batches, test_batches = loaders(args, train_set, test_set, gen, device)
    extra = 1 if args.init in ("warmup1", "const1") else 0
    total_epochs = args.epochs + extra
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.wd)
    log: Dict[str, Any] = {
        MARKER: command, "args": {k: v for k, v in vars(args).items()},
        "model": args.model, "bn": uses_bn, "num_params": num_params, "device": str(device),
        "steps_per_epoch": len(train_batches), "total_epochs": total_epochs, "clip_grad_norm": clip,
        "test_images": min(len(test_set), args.test_batch_size * (args.limit_test_batches or len(test_set))),
        "init": {"method": args.init}, "epochs": [], "acc_1": None, "acc_best": None,
    }
    start_epoch, step = 0, 0
    if resume:
        log, start_epoch, step = resume_run(resume, model, optimizer, device, args=args)
    elif args.init in ("gradinit", "metainit"):
        initialize(args, model, train_set, device, uses_bn, log)
    try:
        train_epochs(args, model, optimizer, log, out_dir, device, train_batches, test_batches, gen,
                     start_epoch=start_epoch, step=step, total_epochs=total_epochs, extra=extra, clip=clip)
    except KeyboardInterrupt:
        ckpt_path = out_dir / "checkpoint.pt"
        done = log["epochs"][-1]["epoch"] if log["epochs"] else 0
        saved = done > start_epoch or (resume and Path(resume).resolve() == ckpt_path.resolve())
        logger.error("interrupted (Ctrl-C) during epoch %d; %s", done + 1,
                     f"{ckpt_path} holds epoch {done}: continue with --resume auto" if saved else
                     "no epoch had finished, nothing was written")
        raise Interrupted() from None
    return log


def warn_unused(args) -> None:
    unused = check_init_options(args)
    if unused:
        runs = {"gradinit": "runs GradInit, which does not read them", "metainit": "runs MetaInit, which does not read "
                "them"}.get(args.init, "runs neither GradInit nor MetaInit")
        logger.warning("WARNING: ignoring %s: --init %s %s", ", ".join(unused), args.init, runs)


def load_data(args):
    """:func:`build_datasets`, its errors worded for the command line."""
    try:
        return build_datasets(args)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    except UsageError:
        raise
    except ValueError as e:  # a damaged data file (read_idx names it)
        raise RunFailure(f"--dataset {args.dataset}: {e}") from None


def loaders(args, train_set, test_set, gen: torch.Generator, device: torch.device) -> Tuple[Limited, Limited]:
    """The training and test batches (``--limit-*-batches`` applied)."""
    remainder = len(train_set) % args.batch_size
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                              generator=gen, drop_last=remainder == 1, pin_memory=device.type == "cuda",
                              persistent_workers=False)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, shuffle=False, num_workers=args.workers,
                             pin_memory=device.type == "cuda")
    return Limited(train_loader, args.limit_train_batches), Limited(test_loader, args.limit_test_batches)


#: Settings a resumed run must share with the run that saved the checkpoint: its log records them once, and
#: another value would train on with settings the log does not show.
RESUME_SETTINGS = ("lr", "batch_size", "seed", "wd", "momentum")


def resume_changes(saved: Dict[str, Any], args) -> Optional[str]:
    """Which of :data:`RESUME_SETTINGS` ``args`` changes from the ``saved`` arguments of a checkpoint, or None."""
    changed = [f"--{k.replace('_', '-')} {saved[k]} -> {getattr(args, k)}" for k in RESUME_SETTINGS
               if k in saved and hasattr(args, k) and saved[k] != getattr(args, k)]
    return ", ".join(changed) or None


def resume_run(resume: str, model, optimizer, device: torch.device, *, args=None) -> Tuple[Dict[str, Any], int, int]:
    """Load ``resume`` into the model, the optimizer and the random generators; returns (log, epoch, step).
    With ``args``, a change of :data:`RESUME_SETTINGS` from the saved run is refused (:class:`UsageError`)."""
    ckpt = load_checkpoint(resume, device)
    changes = resume_changes(ckpt.get("args") or {}, args) if args is not None else None
    if changes:
        raise UsageError(f"--resume {resume} was saved by a run with other settings ({changes}); its log.json records "
                         "the first ones: resume with them, or start a new run with --overwrite (or another "
                         "--output-dir)")
    try:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        saved = ckpt.get("args") or {}
        was = ", ".join(f"--{k.replace('_', '-')} {saved[k]}" for k in ("dataset", "model", "bn", "width")
                        if k in saved)
        first = str(e).splitlines()[0].rstrip(":")
        raise UsageError(f"--resume {resume} holds another network ({was or 'unknown settings'}; {first}); "
                         "resume with the settings of the run that saved it") from None
    log = ckpt["log"]
    start_epoch, step = ckpt["epoch"], ckpt["step"]
    set_rng_state(ckpt["rng"])
    log.setdefault("resumed_from", []).append({"path": str(resume), "epoch": start_epoch})
    logger.info("resumed from %s at epoch %d (step %d)", resume, start_epoch, step)
    return log, start_epoch, step


def initialize(args, model, train_set, device: torch.device, uses_bn: bool, log: Dict[str, Any]) -> None:
    """GradInit or MetaInit, recorded in ``log``."""
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    try:
        info = run_initialization(args, model, train_set, device, uses_bn, progress)
    except FloatingPointError as e:
        raise RunFailure(f"--init {args.init}: {e}") from None
    log["init"] = info
    log["init_wall_time"] = info["wall_time"]
    logger.info("%s took %s", args.init, format_duration(info["wall_time"]))


def cli(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: :func:`main` with one ``error:`` line instead of a traceback for mistakes."""
    parser = get_args_parser()
    args = parser.parse_args(argv)
    try:
        main(args)
    except UsageError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except RunFailure as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 1
    except Interrupted:
        return 130
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted (Ctrl-C) before training started; nothing was written", file=sys.stderr)
        return 130
    return 0


run = quiet_command(cli, COMMAND)
