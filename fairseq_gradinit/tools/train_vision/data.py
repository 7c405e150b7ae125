"""The image data of ``gradinit-train-vision``: CIFAR-10, Fashion-MNIST (IDX files), synthetic images and
image folders, with the paper's augmentation (random crop, flip, cutout) done on tensors."""
from __future__ import annotations

import gzip
import logging
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from .errors import RunFailure, UsageError

logger = logging.getLogger("train_vision")

DATASETS = ("cifar10", "fashion-mnist", "synthetic", "imagefolder")
FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
FASHION_MEAN, FASHION_STD = (0.2860,), (0.3530,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


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
    except RuntimeError:  # torchvision: "Dataset not found or corrupted. You can use download=True ..."
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


def class_folders_differ(train: Path, test: Path) -> Optional[str]:
    """Which class folders ``train`` and ``test`` (an ImageFolder layout) do not share, or None."""
    classes = [sorted(d.name for d in folder.iterdir() if d.is_dir()) for folder in (train, test)]
    if classes[0] == classes[1]:
        return None
    only = [sorted(set(a) - set(b)) for a, b in ((classes[0], classes[1]), (classes[1], classes[0]))]
    return (f"the class folders of {train.name}/ and {test.name}/ differ (only in {train.name}/: {only[0][:5] or 'none'}; "
            f"only in {test.name}/: {only[1][:5] or 'none'})")


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
        differ = class_folders_differ(root / "train", test_root)
        if differ:
            raise UsageError(f"--data-dir {root}: {differ}; ImageFolder numbers the classes by their sorted folder "
                             "names, so every label of the test set would shift: give train/ and "
                             f"{test_root.name}/ the same class folders")
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
