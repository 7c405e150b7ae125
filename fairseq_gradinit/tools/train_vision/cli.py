#!/usr/bin/env python
"""Train an image classifier from the GradInit paper's CIFAR recipe, with GradInit, MetaInit or the
paper's baselines as initialization.

Recipe (paper, Sec. 4.1 and Appendix A): SGD with momentum 0.9, learning rate 0.1, weight decay
1e-4, cosine annealing per iteration to 0, 200 epochs, batch size 128 (64 for DenseNet), random
crop + horizontal flip + cutout, gradient clipping at norm 1 for networks without BN.

    python scripts/train_vision.py --dataset cifar10 --model resnet110 --no-bn --init gradinit

Every epoch writes ``log.json``, ``log.csv`` and ``checkpoint.pt`` to ``--output-dir``;
``--resume auto`` continues from that checkpoint. A folder that holds a run is never written into
without ``--resume`` or ``--overwrite``. Mistakes end in one ``error:`` line (exit status 2 for a bad
argument, 1 for other failures, 130 for Ctrl-C).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import logging
import math
import os
import random
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    import fairseq_gradinit  # noqa: F401
except ImportError:  # running from a source checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fairseq_gradinit.core import GradInitConfig, MetaInitConfig  # noqa: E402
from fairseq_gradinit.core.options import Default, add_arguments, options_of, values_from  # noqa: E402
from fairseq_gradinit.vision import create_model, gradinit, list_models, metainit  # noqa: E402
from fairseq_gradinit.vision.api import VISION_DEFAULTS  # noqa: E402

logger = logging.getLogger("train_vision")

#: The vision API's defaults, with eta, tau and the iterations derived from this script's settings.
GRADINIT_CLI_OPTIONS = tuple(options_of(GradInitConfig, python_only=False, defaults={
    **VISION_DEFAULTS,
    "eta": Default(None, "--lr"),
    "lr": Default(None, "the paper's best tau for the network, else 1e-2; MetaInit's too unless --metainit-lr"),
    "iters": Default(None, "one pass over the training data"),
    "scale_grad_clip": Default(1.0, "1.0; 0 turns it off; MetaInit's too"),
}))
INITS = ("kaiming", "gradinit", "metainit", "warmup1", "const1")
DATASETS = ("cifar10", "fashion-mnist", "synthetic", "imagefolder")
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
FASHION_MEAN, FASHION_STD = (0.2860,), (0.3530,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

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
#: The files of a run in --output-dir.
RUN_FILES = ("checkpoint.pt", "log.json", "log.csv")
CHECKPOINT_KEYS = ("model", "optimizer", "epoch", "step", "log", "rng")


class UsageError(ValueError):
    """A bad argument: one ``error:`` line, exit status 2."""


class RunFailure(RuntimeError):
    """A failure that is not a bad argument (unreadable file, diverged initialization): exit status 1."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during training, after the state of the output folder was logged."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected an integer >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid value {value}: expected an integer >= 1")
    return value


# ----------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------
def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Train a CIFAR-style classifier with GradInit / MetaInit / "
                                "baseline initializations (GradInit paper recipe)", add_help=add_help,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model")
    g.add_argument("--model", default="resnet110", choices=list_models(), help="registered architecture")
    g.add_argument("--bn", default=None, action=argparse.BooleanOptionalAction,
                   help="with or without BN layers (without: learnable biases instead); default: the "
                   "model's default (BN, except fixup_resnet110)")
    g.add_argument("--width", default=1.0, type=float, help="channel-width multiplier (1.0 = the paper's network; "
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
    g.add_argument("--image-size", default=32, type=int, help="imagefolder: side of the (square) training images")
    g.add_argument("--synthetic-train-size", default=512, type=int, help="synthetic: number of training images")
    g.add_argument("--synthetic-test-size", default=128, type=int, help="synthetic: number of test images")
    g.add_argument("--synthetic-shape", default="1,28,28", help="synthetic: image shape C,H,W (1,28,28 is "
                   "Fashion-MNIST's shape)")
    g.add_argument("--synthetic-classes", default=10, type=int, help="synthetic: number of classes")
    g.add_argument("--augment", default=True, action=argparse.BooleanOptionalAction,
                   help="random crop (padding 4) + horizontal flip + cutout on training images")
    g.add_argument("--cutout-length", default=None, type=int, help="side of the cutout square (default: half "
                   "the image side, 16 for CIFAR; 0 disables cutout)")
    g.add_argument("--workers", default=2, type=int, help="DataLoader worker processes")

    g = p.add_argument_group("training")
    g.add_argument("--epochs", default=200, type=positive_int,
                   help="epochs of the cosine schedule (warmup1/const1 add one)")
    g.add_argument("--batch-size", default=None, type=positive_int,
                   help="training batch size (default: 128, 64 for densenet100)")
    g.add_argument("--test-batch-size", default=256, type=positive_int, help="evaluation batch size")
    g.add_argument("--lr", default=0.1, type=float, help="base learning rate of SGD")
    g.add_argument("--momentum", default=0.9, type=float, help="SGD momentum")
    g.add_argument("--wd", "--weight-decay", dest="wd", default=1e-4, type=float, help="weight decay")
    g.add_argument("--clip-grad-norm", default=None, type=float, help="clip the gradient norm during training "
                   "(default: 1 for networks without BN, off otherwise; 0 turns it off)")
    g.add_argument("--limit-train-batches", default=None, type=positive_int, help="use at most this many batches per "
                   "epoch (also bounds the GradInit/MetaInit pass); for quick runs")
    g.add_argument("--limit-test-batches", default=None, type=positive_int,
                   help="evaluate on at most this many batches")
    g.add_argument("--seed", default=0, type=int, help="random seed")
    g.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    g.add_argument("--threads", default=None, type=int, help="torch.set_num_threads for CPU runs")
    g.add_argument("--log-interval", default=50, type=int, help="log training progress every N batches")

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
    return p


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------
def read_idx(path: Path) -> torch.Tensor:
    """Read an IDX file (MNIST format, optionally gzip-compressed) of unsigned bytes."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path} is not an IDX file")
    if data[2] != 0x08:
        raise ValueError(f"{path}: only unsigned-byte IDX files are supported (type code {data[2]:#x})")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    count = int(np.prod(dims)) if dims else 0
    if len(data) - offset != count:
        raise ValueError(f"{path}: expected {count} bytes of data after the header, found {len(data) - offset}")
    arr = np.frombuffer(data, dtype=np.uint8, count=count, offset=offset).reshape(dims)
    return torch.from_numpy(arr.copy())


def find_fashion_mnist(data_dir: Optional[str]) -> Dict[str, Path]:
    candidates: List[Path] = []
    if data_dir:
        candidates += [Path(data_dir), Path(data_dir) / "fashion-mnist"]
    candidates += [Path(d) for d in FASHION_MNIST_DIRS]
    for d in candidates:
        found = {}
        for key, stem in FASHION_MNIST_FILES.items():
            for name in (stem + ".gz", stem):
                if (d / name).is_file():
                    found[key] = d / name
                    break
        if len(found) == len(FASHION_MNIST_FILES):
            return found
    names = ", ".join(s + ".gz" for s in FASHION_MNIST_FILES.values())
    raise FileNotFoundError(
        f"Fashion-MNIST not found (looked in {', '.join(str(c) for c in candidates)}). Install it with "
        "`apt-get install dataset-fashion-mnist` (files go to /usr/share/datasets/fashion-mnist), or pass "
        f"--data-dir pointing to a folder with {names}")


def load_cifar10(data_dir: str, *, download: bool):
    """torchvision's CIFAR-10 (train, test); a missing or failed download raises with what to do."""
    import torchvision

    try:
        return (torchvision.datasets.CIFAR10(data_dir, train=True, download=download),
                torchvision.datasets.CIFAR10(data_dir, train=False, download=download))
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted. You can use download=True ..."
        if download:
            raise
        raise FileNotFoundError(
            f"--data-dir {data_dir}: CIFAR-10 not found (no readable cifar-10-batches-py in it); drop --no-download "
            "to download it there, or point --data-dir to the folder that holds cifar-10-batches-py") from None
    except OSError as e:  # no network, disk full...
        raise RunFailure(
            f"downloading CIFAR-10 into --data-dir {data_dir} failed ({e}); check the network, or put "
            "cifar-10-python.tar.gz (or its extracted cifar-10-batches-py) into --data-dir") from None


class Cutout:
    """Zero a random ``length`` x ``length`` square of a (C, H, W) tensor (clipped at the borders)."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        _, h, w = x.shape
        cy, cx = int(torch.randint(0, h, ()).item()), int(torch.randint(0, w, ()).item())
        half = self.length // 2
        x = x.clone()
        x[:, max(0, cy - half):min(h, cy + half), max(0, cx - half):min(w, cx + half)] = 0.0
        return x


class TensorImageDataset(Dataset):
    """Images held as a uint8 tensor (N, C, H, W) with the CIFAR augmentation done on tensors:
    zero-padded random crop, horizontal flip, normalization, then cutout (DeVries & Taylor, 2017)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                 train: bool = False, augment: bool = True, padding: int = 4, cutout: int = 0):
        if images.dim() == 3:
            images = images.unsqueeze(1)
        self.images, self.labels = images, labels.long()
        c = images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(c, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(c, 1, 1)
        self.augment = train and augment
        self.padding = padding
        self.cutout = Cutout(cutout) if (self.augment and cutout > 0) else None

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i].float().div_(255.0)
        if self.augment:
            _, h, w = x.shape
            if self.padding > 0:
                x = F.pad(x, (self.padding,) * 4)
                top = int(torch.randint(0, 2 * self.padding + 1, ()).item())
                left = int(torch.randint(0, 2 * self.padding + 1, ()).item())
                x = x[:, top:top + h, left:left + w]
            if torch.rand(()).item() < 0.5:
                x = x.flip(-1)
        x = (x - self.mean) / self.std
        if self.cutout is not None:
            x = self.cutout(x)
        return x, self.labels[i]


def synthetic_data(n: int, shape: Sequence[int], classes: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Random images with a class-dependent pattern (so they can be learned), as uint8."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.rand((classes, *shape), generator=g)
    labels = torch.randint(0, classes, (n,), generator=g)
    x = 0.6 * protos[labels] + 0.4 * torch.rand((n, *shape), generator=g)
    return (x * 255).round().clamp(0, 255).to(torch.uint8), labels


def build_datasets(args) -> Tuple[Dataset, Dataset, int, int, int]:
    """(train, test, num_classes, in_channels, image side)."""
    aug = args.augment

    def cut(side):
        return side // 2 if args.cutout_length is None else args.cutout_length

    if args.dataset == "cifar10":
        tr, te = load_cifar10(args.data_dir, download=args.download)
        to_t = lambda d: torch.from_numpy(np.asarray(d.data)).permute(0, 3, 1, 2).contiguous()  # noqa: E731
        train = TensorImageDataset(to_t(tr), torch.tensor(tr.targets), CIFAR10_MEAN, CIFAR10_STD, True, aug,
                                   cutout=cut(32))
        test = TensorImageDataset(to_t(te), torch.tensor(te.targets), CIFAR10_MEAN, CIFAR10_STD)
        return train, test, 10, 3, 32
    if args.dataset == "fashion-mnist":
        files = find_fashion_mnist(args.data_dir)
        logger.info("Fashion-MNIST from %s", files["train_images"].parent)
        train = TensorImageDataset(read_idx(files["train_images"]), read_idx(files["train_labels"]), FASHION_MEAN,
                                   FASHION_STD, True, aug, cutout=cut(28))
        test = TensorImageDataset(read_idx(files["test_images"]), read_idx(files["test_labels"]), FASHION_MEAN,
                                  FASHION_STD)
        return train, test, 10, 1, 28
    if args.dataset == "synthetic":
        try:
            shape = tuple(int(s) for s in args.synthetic_shape.split(","))
            assert len(shape) == 3 and all(s > 0 for s in shape)
        except (ValueError, AssertionError):
            raise UsageError(f"--synthetic-shape={args.synthetic_shape!r}: expected C,H,W like 1,28,28") from None
        c = shape[0]
        xtr, ytr = synthetic_data(args.synthetic_train_size, shape, args.synthetic_classes, args.seed)
        xte, yte = synthetic_data(args.synthetic_test_size, shape, args.synthetic_classes, args.seed + 1)
        mean, std = (0.5,) * c, (0.25,) * c
        train = TensorImageDataset(xtr, ytr, mean, std, True, aug, cutout=cut(shape[1]))
        test = TensorImageDataset(xte, yte, mean, std)
        return train, test, args.synthetic_classes, c, shape[1]
    if args.dataset == "imagefolder":
        import torchvision
        from torchvision import transforms as T
        root = Path(args.data_dir)
        test_root = next((root / d for d in ("val", "test") if (root / d).is_dir()), None)
        if not (root / "train").is_dir() or test_root is None:
            raise FileNotFoundError(f"--data-dir {root}: --dataset imagefolder expects the folders {root}/train and "
                                    f"{root}/val (or {root}/test), one subfolder per class in each")
        s = args.image_size
        norm = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)
        train_tf = [T.Resize(s), T.CenterCrop(s)]
        if aug:
            train_tf += [T.RandomCrop(s, padding=max(1, s // 8)), T.RandomHorizontalFlip()]
        train_tf += [T.ToTensor(), norm]
        if aug and cut(s) > 0:
            train_tf.append(Cutout(cut(s)))
        train = torchvision.datasets.ImageFolder(str(root / "train"), T.Compose(train_tf))
        test = torchvision.datasets.ImageFolder(str(test_root), T.Compose([T.Resize(s), T.CenterCrop(s),
                                                                            T.ToTensor(), norm]))
        return train, test, len(train.classes), 3, s
    raise ValueError(f"unknown dataset {args.dataset!r}")


class Limited:
    """Re-iterable view of the first ``limit`` batches of ``loader``."""

    def __init__(self, loader, limit: Optional[int]):
        self.loader, self.limit = loader, limit

    def __iter__(self) -> Iterator[Any]:
        for i, b in enumerate(self.loader):
            if self.limit is not None and i >= self.limit:
                break
            yield b

    def __len__(self) -> int:
        n = len(self.loader)
        return n if self.limit is None else min(n, self.limit)


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------
def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def lr_at(step: int, *, base_lr: float, steps_per_epoch: int, epochs: int, init: str) -> float:
    """Learning rate of training iteration ``step`` (0-based): for warmup1/const1 one extra epoch of
    linear warmup / constant rate, then cosine annealing over ``epochs`` epochs, reaching 0 after
    the last iteration."""
    extra = steps_per_epoch if init in ("warmup1", "const1") else 0
    if step < extra:
        return base_lr * (step + 1) / steps_per_epoch if init == "warmup1" else base_lr
    total = max(1, epochs * steps_per_epoch)
    t = min(step - extra, total)
    return 0.5 * base_lr * (1.0 + math.cos(math.pi * t / total))


def evaluate(model: nn.Module, loader, device: torch.device) -> Tuple[float, float]:
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            out = model(x)
            loss_sum += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
            count += y.numel()
    return loss_sum / max(count, 1), 100.0 * correct / max(count, 1)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


CSV_FIELDS = ("epoch", "phase", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "train_time", "eval_time",
              "grad_norm")


def write_logs(out_dir: Path, log: Dict[str, Any]) -> None:
    _atomic_write(out_dir / "log.json", json.dumps(log, indent=1))
    tmp = out_dir / "log.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in log["epochs"]:
            w.writerow(row)
    os.replace(tmp, out_dir / "log.csv")


def default_output_dir(args) -> str:
    """A folder name that tells runs apart by the settings one usually varies (``args.batch_size``
    resolved)."""
    bn = {True: "bn", False: "nobn", None: "default"}[args.bn]
    name = (f"{args.dataset}-{args.model}-{bn}-w{args.width:g}-{args.init}-lr{args.lr:g}-e{args.epochs}"
            f"-wd{args.wd:g}-b{args.batch_size}")
    tau = args.metainit_lr if args.init == "metainit" and args.metainit_lr is not None else args.gradinit_lr
    if args.init in ("gradinit", "metainit") and tau is not None:
        name += f"-tau{tau:g}"
    if args.limit_train_batches is not None:
        name += f"-l{args.limit_train_batches}"
    return os.path.join("runs", f"{name}-s{args.seed}")


def check_output_dir(out_dir: Path, *, resume: str, overwrite: bool) -> str:
    """Refuse to write into a folder holding another run; returns the checkpoint to resume ('' for none)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--output-dir {out_dir} is an existing file; give a folder")
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other: --resume continues the run in "
                         "--output-dir, --overwrite starts a new one there")
    ckpt = out_dir / "checkpoint.pt"
    present = [n for n in RUN_FILES if (out_dir / n).is_file()]
    if resume == "auto":
        if ckpt.is_file():
            return str(ckpt)
        resume = ""
    if not present or overwrite:
        return resume
    if resume and Path(resume).resolve() == ckpt.resolve():
        return resume
    what = ", ".join(present)
    if resume:
        raise UsageError(f"--output-dir {out_dir} holds another run ({what}); resuming {resume} there would replace "
                         "it: choose another --output-dir, or pass --overwrite instead of --resume to start over there")
    if not ckpt.is_file():
        raise UsageError(f"--output-dir {out_dir} holds {what} but no checkpoint.pt to resume from; choose another "
                         "--output-dir, or pass --overwrite to start a new run there")
    raise UsageError(f"--output-dir {out_dir} already holds a run ({what}); continue it with --resume auto, start "
                     "a new one there with --overwrite, or choose another --output-dir")


def load_checkpoint(path: str, device: torch.device) -> Dict[str, Any]:
    """A train_vision.py checkpoint, or an error naming --resume and what to do."""
    if not Path(path).is_file():
        raise UsageError(f"--resume {path}: no such file; give the checkpoint.pt of an earlier run, or 'auto' for "
                         "--output-dir's")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 - truncated zip, pickle errors, EOF...
        raise RunFailure(f"--resume {path}: cannot read the checkpoint ({type(e).__name__}: {e}); it may be "
                         "truncated: resume from a copy, or start again with --overwrite") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise UsageError(f"--resume {path} is not a checkpoint of train_vision.py (it lacks {', '.join(missing)}); "
                         "give the checkpoint.pt of an earlier train_vision.py run")
    return ckpt


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
        options.update(eta=args.lr if options["eta"] is None else options["eta"], lr=lr,
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


def _rng_state() -> Dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: Dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def main(args) -> Dict[str, Any]:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    unused = check_init_options(args)
    if unused:
        runs = {"gradinit": "runs GradInit, which does not read them", "metainit": "runs MetaInit, which does not read "
                "them"}.get(args.init, "runs neither GradInit nor MetaInit")
        logger.warning("WARNING: ignoring %s: --init %s %s", ", ".join(unused), args.init, runs)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.batch_size is None:
        args.batch_size = 64 if args.model.startswith("densenet") else 128
    out_dir = Path(args.output_dir or default_output_dir(args))
    ckpt_path = out_dir / "checkpoint.pt"
    resume = check_output_dir(out_dir, resume=args.resume, overwrite=args.overwrite)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    try:
        train_set, test_set, num_classes, in_channels, side = build_datasets(args)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    except UsageError:
        raise
    except ValueError as e:  # a damaged data file (read_idx names it)
        raise RunFailure(f"--dataset {args.dataset}: {e}") from None
    check_batches(args, len(train_set), resume)
    kwargs: Dict[str, Any] = dict(num_classes=num_classes, in_channels=in_channels, width=args.width)
    if args.bn is not None:
        kwargs["bn"] = args.bn
    if args.model.startswith("fixup"):
        fixup = args.fixup_init if args.fixup_init is not None else args.init not in ("gradinit", "metainit")
        kwargs["fixup_init"] = fixup
    elif args.fixup_init is not None:
        raise UsageError("--fixup-init/--no-fixup-init only apply to fixup_* models")
    model = create_model(args.model, **kwargs).to(device)
    uses_bn = has_batchnorm(model)
    clip = args.clip_grad_norm if args.clip_grad_norm is not None else (0.0 if uses_bn else 1.0)
    num_params = sum(p.numel() for p in model.parameters())
    logger.info("%s (%s BN, width %g): %.2fM parameters; %d classes, %d input channel(s), %dpx images",
                args.model, "with" if uses_bn else "without", args.width, num_params / 1e6, num_classes,
                in_channels, side)

    gen = torch.Generator().manual_seed(args.seed)
    remainder = len(train_set) % args.batch_size
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                              generator=gen, drop_last=remainder == 1, pin_memory=device.type == "cuda",
                              persistent_workers=False)
    test_loader = DataLoader(test_set, batch_size=args.test_batch_size, shuffle=False, num_workers=args.workers,
                             pin_memory=device.type == "cuda")
    train_batches = Limited(train_loader, args.limit_train_batches)
    test_batches = Limited(test_loader, args.limit_test_batches)
    steps_per_epoch = len(train_batches)
    extra = 1 if args.init in ("warmup1", "const1") else 0
    total_epochs = args.epochs + extra

    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.wd)
    log: Dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items()},
        "model": args.model, "bn": uses_bn, "num_params": num_params, "device": str(device),
        "steps_per_epoch": steps_per_epoch, "total_epochs": total_epochs, "clip_grad_norm": clip,
        "init": {"method": args.init}, "epochs": [], "acc_1": None, "acc_best": None,
    }
    start_epoch, step = 0, 0
    if resume:
        ckpt = load_checkpoint(resume, device)
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
        _set_rng_state(ckpt["rng"])
        log.setdefault("resumed_from", []).append({"path": str(resume), "epoch": start_epoch})
        logger.info("resumed from %s at epoch %d (step %d)", resume, start_epoch, step)
    elif args.init in ("gradinit", "metainit"):
        progress = args.progress if args.progress is not None else sys.stderr.isatty()
        try:
            info = run_initialization(args, model, train_set, device, uses_bn, progress)
        except FloatingPointError as e:
            raise RunFailure(f"--init {args.init}: {e}") from None
        log["init"] = info
        log["init_wall_time"] = info["wall_time"]
        logger.info("%s took %.1fs", args.init, info["wall_time"])

    try:
        train_epochs(args, model, optimizer, log, out_dir, device, train_batches, test_batches, gen,
                     start_epoch=start_epoch, step=step, total_epochs=total_epochs, extra=extra, clip=clip)
    except KeyboardInterrupt:
        done = log["epochs"][-1]["epoch"] if log["epochs"] else 0
        saved = done > start_epoch or (resume and Path(resume).resolve() == ckpt_path.resolve())
        logger.error("interrupted (Ctrl-C) during epoch %d; %s", done + 1,
                     f"{ckpt_path} holds epoch {done}: continue with --resume auto" if saved else
                     "no epoch had finished, nothing was written")
        raise Interrupted() from None
    return log


def train_epochs(args, model, optimizer, log, out_dir: Path, device, train_batches, test_batches, gen, *,
                 start_epoch: int, step: int, total_epochs: int, extra: int, clip: float) -> None:
    """The training loop; every epoch ends with checkpoint.pt, log.json and log.csv in ``out_dir``."""
    ckpt_path = out_dir / "checkpoint.pt"
    steps_per_epoch = len(train_batches)
    for epoch in range(start_epoch, total_epochs):
        phase = ("warmup" if args.init == "warmup1" else "const") if epoch < extra else "cosine"
        gen.manual_seed(args.seed * 100_003 + epoch)  # shuffling (and worker seeds) per epoch: resumable
        model.train()
        t0 = time.perf_counter()
        loss_sum, correct, count, gnorm_sum, nb = 0.0, 0, 0, 0.0, 0
        lr = args.lr
        for i, (x, y) in enumerate(train_batches):
            lr = lr_at(step, base_lr=args.lr, steps_per_epoch=steps_per_epoch, epochs=args.epochs, init=args.init)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            out = model(x)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip > 0:
                gnorm_sum += float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            optimizer.step()
            step += 1
            nb += 1
            loss_sum += loss.item() * y.numel()
            correct += (out.argmax(1) == y).sum().item()
            count += y.numel()
            if args.log_interval and (i + 1) % args.log_interval == 0:
                logger.info("epoch %d [%d/%d] loss %.4f acc %.2f lr %.4g", epoch + 1, i + 1, steps_per_epoch,
                            loss_sum / count, 100.0 * correct / count, lr)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        train_time = time.perf_counter() - t0
        t1 = time.perf_counter()
        test_loss, test_acc = evaluate(model, test_batches, device)
        eval_time = time.perf_counter() - t1
        train_loss = loss_sum / max(count, 1)
        if not math.isfinite(train_loss):
            logger.warning("epoch %d: the training loss is not finite", epoch + 1)
        row = {"epoch": epoch + 1, "phase": phase, "lr": lr, "train_loss": train_loss,
               "train_acc": 100.0 * correct / max(count, 1), "test_loss": test_loss, "test_acc": test_acc,
               "train_time": train_time, "eval_time": eval_time, "grad_norm": gnorm_sum / nb if clip > 0 and nb else None}
        log["epochs"].append(row)
        accs = [r["test_acc"] for r in log["epochs"]]
        log["acc_first_epoch"] = accs[0]
        main_epochs = [r for r in log["epochs"] if r["phase"] == "cosine"]
        log["acc_1"] = main_epochs[0]["test_acc"] if main_epochs else None
        log["acc_best"] = max(accs)
        times = [r["train_time"] for r in log["epochs"]]
        log["epoch_wall_time_mean"] = sum(times) / len(times)
        if log.get("init_wall_time") is not None:
            log["init_time_over_epoch"] = log["init_wall_time"] / log["epoch_wall_time_mean"]
        logger.info("epoch %d/%d (%s) | train loss %.4f acc %.2f | test loss %.4f acc %.2f | best %.2f | %.1fs",
                    epoch + 1, total_epochs, phase, train_loss, row["train_acc"], test_loss, test_acc,
                    log["acc_best"], train_time)
        out_dir.mkdir(parents=True, exist_ok=True)  # only now: a run that fails earlier leaves no folder
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                    "step": step, "log": log, "rng": _rng_state(), "args": vars(args)}, str(ckpt_path) + ".tmp")
        os.replace(str(ckpt_path) + ".tmp", ckpt_path)
        write_logs(out_dir, log)
    if log["epochs"]:
        write_logs(out_dir, log)


#: The flags of train_vision.py's own initialization options and their defaults (the others are
#: GRADINIT_CLI_OPTIONS).
OWN_INIT_DEFAULTS = {"gradinit_batch_size": None, "metainit_lr": None, "metainit_iters": None, "metainit_eps": 1e-5,
                     "metainit_batch_size": None}
#: MetaInit reads these GradInit flags (its scale bounds and gradient clip, and tau as its default lr).
METAINIT_SHARED = ("gradinit_lr", "gradinit_min_scale", "gradinit_max_scale", "gradinit_scale_grad_clip")
_CONFIG_ERROR = re.compile(r"^(GradInit|MetaInit)Config\.(\w+)=(.*?) is invalid: (.*)$", re.S)


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
            eta = args.lr if args.init == "gradinit" else GradInitConfig.eta
        options.update(eta=eta, lr=gi_lr, scale_grad_clip=options["scale_grad_clip"] or None)
        GradInitConfig(**options)
        MetaInitConfig(lr=args.metainit_lr if args.metainit_lr is not None else gi_lr, iters=args.metainit_iters,
                       eps=args.metainit_eps, min_scale=options["min_scale"], max_scale=options["max_scale"],
                       scale_grad_clip=options["scale_grad_clip"])
    except ValueError as e:
        m = _CONFIG_ERROR.match(str(e))
        if not m:
            raise UsageError(str(e)) from None
        kind, name, value, rest = m.groups()
        flag = f"--{kind.lower()}-{name.replace('_', '-')}"
        if kind == "GradInit" and name == "eta" and eta_from_lr:
            flag = "--lr (the default of --gradinit-eta)"
        raise UsageError(f"argument {flag}: invalid value {value}: {rest}") from None
    defaults = {f"gradinit_{spec.name}": spec.default for spec in GRADINIT_CLI_OPTIONS if not spec.python_only}
    defaults.update(OWN_INIT_DEFAULTS)
    used = {"gradinit": {d for d in defaults if d.startswith("gradinit_")},
            "metainit": {d for d in defaults if d.startswith("metainit_")} | set(METAINIT_SHARED)}.get(args.init, set())
    return [f"{_flag(d)} {getattr(args, d)}" for d, default in defaults.items()
            if d not in used and getattr(args, d, default) != default]


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


if __name__ == "__main__":
    from fairseq_gradinit.quiet import hide_known_noise

    hide_known_noise()
    sys.exit(cli())
