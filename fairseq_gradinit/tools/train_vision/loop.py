"""The training loop of ``gradinit-train-vision``: the paper's learning-rate schedule, evaluation, and the
run's folder (checkpoint.pt, log.json, log.csv written every epoch; resuming from them)."""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...files.paths import MARKER, json_result, kind_problem, save_atomic, write_json
from .errors import RunFailure, UsageError

logger = logging.getLogger("train_vision")

#: The files of a run in --output-dir.
RUN_FILES = ("checkpoint.pt", "log.json", "log.csv")
#: The commands whose runs --overwrite may replace (gradinit-compare-vision's runs are gradinit-train-vision's).
RUN_WRITERS = ("gradinit-train-vision", "gradinit-compare-vision")
CHECKPOINT_KEYS = ("model", "optimizer", "epoch", "step", "log", "rng")


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


CSV_FIELDS = ("epoch", "phase", "lr", "train_loss", "train_acc", "test_loss", "test_acc", "train_time", "eval_time",
              "grad_norm")


def write_logs(out_dir: Path, log: Dict[str, Any]) -> None:
    """log.json (strict JSON, marked with the command that runs, ``log["written_by"]``) and log.csv."""
    write_json(out_dir / "log.json", log)
    def write_csv(tmp):
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for row in log["epochs"]:
                w.writerow(row)

    save_atomic(write_csv, out_dir / "log.csv")


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


def run_writer(out_dir: Path) -> Optional[str]:
    """The command that wrote the run in ``out_dir`` (its log.json's ``written_by``;
    gradinit-train-vision for a log.json of an earlier version, which records no writer), or None when
    ``out_dir`` holds no log.json of a run."""
    problem = kind_problem(out_dir / "log.json", json_result("a run's log", "epochs", "args"))
    if problem or not (out_dir / "log.json").is_file():
        return None
    try:
        log = json.loads((out_dir / "log.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return log.get(MARKER) or "gradinit-train-vision"


def check_output_dir(out_dir: Path, *, resume: str, overwrite: bool) -> str:
    """Refuse to write into a folder holding another run, or files a run of this command did not write
    (even with ``overwrite``); returns the checkpoint to resume ('' for none)."""
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
    if present and overwrite and run_writer(out_dir) not in RUN_WRITERS:
        raise UsageError(f"--output-dir {out_dir} holds {', '.join(present)}, which gradinit-train-vision did not "
                         "write (there is no log.json of its run beside them); it never replaces files of others, "
                         "even with --overwrite: choose another --output-dir, or move them away yourself")
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


def rng_state() -> Dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: Dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


class StepWindow:
    """Mean training loss and accuracy of the batches since the last ``--log-interval`` row."""

    def __init__(self):
        self.loss_sum, self.correct, self.count = 0.0, 0, 0

    def add(self, mean_loss: float, correct: int, count: int) -> None:
        self.loss_sum += mean_loss * count
        self.correct += correct
        self.count += count

    def row(self, **where) -> Dict[str, Any]:
        """``where`` (step, epoch, lr) with the window's ``loss`` and ``acc`` (%); the window restarts."""
        n = max(self.count, 1)
        row = {**where, "loss": self.loss_sum / n, "acc": 100.0 * self.correct / n}
        self.__init__()
        return row


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
        window = StepWindow()
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
            batch_loss, hits = loss.item(), (out.argmax(1) == y).sum().item()
            loss_sum += batch_loss * y.numel()
            correct += hits
            count += y.numel()
            window.add(batch_loss, hits, y.numel())
            if args.log_interval and (i + 1) % args.log_interval == 0:
                log.setdefault("steps", []).append(window.row(step=step, epoch=epoch + 1, lr=lr))
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
        # log.json first: a folder with a checkpoint.pt always has the log.json that marks the run as ours
        write_logs(out_dir, log)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1,
                 "step": step, "log": log, "rng": rng_state(), "args": vars(args)}
        save_atomic(lambda f: torch.save(state, f), ckpt_path)  # a full disk: one OSError, no temporary file left
    if log["epochs"]:
        write_logs(out_dir, log)
