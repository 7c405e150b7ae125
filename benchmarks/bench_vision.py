#!/usr/bin/env python
"""Cost of GradInit iterations relative to a training step on the paper's CIFAR networks.

For each network it measures, on fresh copies of the same initialized model:

* ``train``: one SGD training step (momentum 0.9, weight decay 1e-4, gradient clipping at norm 1
  for networks without BN) on a batch of ``--batch-size`` images;
* ``objective``: one GradInit iteration that takes the objective branch (forced with a huge
  gamma): gradient on S, the SGD step, loss and scale gradient on S~;
* ``constraint``: one GradInit iteration that takes the constraint branch (forced with a tiny
  gamma): gradient on S and the second-order pass for d||g||/d alpha;

with S and S~ each of ``--batch-size`` images. The GradInit iterations run the library's one
engine (:class:`fairseq_gradinit.core.GradInit`) exactly as :func:`gradinit` does.

Time: median wall time of ``--repeats`` runs after ``--warmup`` untimed runs (CUDA synchronized);
the process CPU time is recorded too (on a shared CPU machine it is less disturbed by other
processes than the wall time; the ratios in the table use the wall time).

Peak memory: the highest amount of tensor memory allocated during one step, counting the tensors
that stay resident across steps (parameters, buffers, SGD momentum for training; parameters,
buffers, GradInit's copies W of the weights and its Adam state for GradInit).

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (exact, includes
  everything allocated on the device).
* CPU: the PyTorch profiler with ``profile_memory=True`` records every CPU tensor allocation and
  free with the allocator's running total of the bytes allocated while profiling; the maximum of
  that total is the step's peak of new allocations, to which the resident bytes (counted from
  the tensors themselves) are added. Process-level figures (``ru_maxrss``) are not used: the
  resident set only grows, includes the allocator's caches and Python, and cannot isolate a step.

Writes ``<out>.json`` and ``<out>.md`` (a Markdown table with the ratios to the training step and
the targets: objective <= 2.1x time and <= 1.3x peak memory, constraint <= 3x time).

    python benchmarks/bench_vision.py --device cuda --batch-size 128 --repeats 20
    python benchmarks/bench_vision.py --device cpu --batch-size 16 --repeats 2 --threads 1
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import GradInit, GradInitConfig, gradinit_mode
from fairseq_gradinit.core.batching import BatchPair
from fairseq_gradinit.vision import classification_loss, create_model

logger = logging.getLogger("bench_vision")

TARGETS = {"objective_time": 2.1, "objective_memory": 1.3, "constraint_time": 3.0}


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Time and peak memory of GradInit iterations vs a training step",
                                add_help=add_help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", default="resnet110:nobn,resnet110:bn,vgg19:bn",
                   help="comma-separated registry names, each optionally with :bn or :nobn")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--batch-size", default=128, type=int, help="training batch size = |S| = |S~|")
    p.add_argument("--image-size", default=32, type=int, help="side of the random input images")
    p.add_argument("--width", default=1.0, type=float, help="channel-width multiplier of the networks")
    p.add_argument("--repeats", default=10, type=int, help="timed runs of each step")
    p.add_argument("--warmup", default=2, type=int, help="untimed runs before timing")
    p.add_argument("--eta", default=0.1, type=float, help="GradInit's eta (the SGD learning rate)")
    p.add_argument("--threads", default=None, type=int, help="torch.set_num_threads (CPU)")
    p.add_argument("--seed", default=0, type=int, help="random seed")
    p.add_argument("--fd", action="store_true",
                   help="also time a constraint iteration with constraint_grad='finite_difference' (opt-in, approximate)")
    p.add_argument("--out", default="benchmarks/results/vision", help="output path prefix (.json and .md are added)")
    return p


# ----------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        key = (t.untyped_storage().data_ptr(), t.device)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def cpu_step_peak(fn: Callable[[], Any]) -> Optional[int]:
    """Peak of the bytes newly allocated (and not yet freed) on the CPU while ``fn`` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    try:
        tree = prof.profiler.kineto_results.experimental_event_tree()
    except AttributeError:  # pragma: no cover - profiler internals of another torch version
        return None
    peak, stack = 0, list(tree)
    found = False
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        ef = node.extra_fields
        if type(ef).__name__ == "_ExtraFields_Allocation" and str(ef.device).startswith("cpu"):
            found = True
            peak = max(peak, int(ef.total_allocated))
    return peak if found else None


def measure(fn: Callable[[], Any], device: torch.device, resident: Callable[[], int], warmup: int,
            repeats: int) -> Dict[str, Any]:
    for _ in range(warmup):
        fn()
    _sync(device)
    times: List[float] = []
    cpu_times: List[float] = []
    for _ in range(repeats):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    gc.collect()
    res = resident()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device)
        step_peak = peak - before
        method = "torch.cuda.max_memory_allocated"
    else:
        step_peak = cpu_step_peak(fn)
        peak = None if step_peak is None else res + step_peak
        method = "torch.profiler CPU allocations + resident tensors"
    return {"time_s": statistics.median(times) if times else None, "times_s": times,
            "cpu_time_s": statistics.median(cpu_times) if cpu_times else None, "peak_bytes": peak,
            "step_peak_bytes": step_peak, "resident_bytes": res, "memory_method": method}


def build(name: str, bn: Optional[bool], args, device: torch.device) -> nn.Module:
    torch.manual_seed(args.seed)
    kw: Dict[str, Any] = {"width": args.width}
    if bn is not None:
        kw["bn"] = bn
    return create_model(name, **kw).to(device)


def bench_model(name: str, bn: Optional[bool], args, device: torch.device) -> Dict[str, Any]:
    g = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, 3, args.image_size, args.image_size)
    x1, x2 = torch.randn(shape, generator=g).to(device), torch.randn(shape, generator=g).to(device)
    y1 = torch.randint(0, 10, (args.batch_size,), generator=g).to(device)
    y2 = torch.randint(0, 10, (args.batch_size,), generator=g).to(device)
    out: Dict[str, Any] = {"model": name, "bn": bn}

    # -- training step ----------------------------------------------------------------------
    model = build(name, bn, args, device)
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    out["bn"] = has_bn
    out["num_params"] = sum(p.numel() for p in model.parameters())
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=1e-4)

    def train_step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x1), y1)
        loss.backward()
        if not has_bn:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    train_step()  # creates the momentum buffers: resident from then on

    def train_resident():
        states = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        return tensor_bytes(list(model.parameters()) + list(model.buffers()) + states)

    out["train"] = measure(train_step, device, train_resident, args.warmup, args.repeats)
    logger.info("  train step: %.1f ms", 1000 * out["train"]["time_s"])
    opt = model = None  # frees them (not `del`: the closures above read the names)
    gc.collect()

    # -- GradInit iterations ----------------------------------------------------------------
    pair = BatchPair((x1, y1), (x2, y2))
    kinds = [("objective", 1e30), ("constraint", 1e-30)] + ([("constraint_fd", 1e-30)] if args.fd else [])
    for branch, gamma in kinds:
        model = build(name, bn, args, device)
        model.train()
        cfg = GradInitConfig(optimizer="sgd", eta=args.eta, gamma=gamma, lr=1e-3, betas=(0.9, 0.999),
                             sgd_step="grad", scale_grad_clip=1.0, max_consecutive_skips=10 ** 9, log_interval=10 ** 9,
                             constraint_grad="finite_difference" if branch == "constraint_fd" else "exact")
        engine = GradInit(model, classification_loss, cfg)
        branches: List[str] = []

        def gi_step():
            with gradinit_mode(model):
                branches.append(engine.step(pair).branch)

        def gi_resident():
            return tensor_bytes(list(model.parameters()) + list(model.buffers()) + list(engine.target.scaled.W)
                                + [engine.state.alpha, engine.state.adam.m, engine.state.adam.v])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            res = measure(gi_step, device, gi_resident, args.warmup, args.repeats)
            engine.finalize()
        taken = {b for b in branches if b != "skipped"}
        if taken != {branch.split("_")[0]}:
            raise RuntimeError(f"{name}: forcing the {branch} branch failed (took {sorted(taken)})")
        res["skipped"] = sum(r.branch == "skipped" for r in engine.history)
        out[branch] = res
        logger.info("  %s iteration: %.1f ms", branch, 1000 * res["time_s"])
        engine = model = None  # frees them (not `del`: the closures above read the names)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    out["ratios"] = ratios(out)
    return out


def ratios(out: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """GradInit iterations over the training step, in time and peak memory."""
    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    result = {
        "objective_cpu_time": ratio(out["objective"]["cpu_time_s"], out["train"]["cpu_time_s"]),
        "constraint_cpu_time": ratio(out["constraint"]["cpu_time_s"], out["train"]["cpu_time_s"]),
        "objective_time": ratio(out["objective"]["time_s"], out["train"]["time_s"]),
        "objective_memory": ratio(out["objective"]["peak_bytes"], out["train"]["peak_bytes"]),
        "constraint_time": ratio(out["constraint"]["time_s"], out["train"]["time_s"]),
        "constraint_memory": ratio(out["constraint"]["peak_bytes"], out["train"]["peak_bytes"]),
    }
    if "constraint_fd" in out:
        result["constraint_fd_time"] = ratio(out["constraint_fd"]["time_s"], out["train"]["time_s"])
        result["constraint_fd_cpu_time"] = ratio(out["constraint_fd"]["cpu_time_s"], out["train"]["cpu_time_s"])
    return result


def parse_models(spec: str) -> List[Tuple[str, Optional[bool]]]:
    items = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, flag = part.partition(":")
        if flag not in ("", "bn", "nobn"):
            raise ValueError(f"--models entry {part!r}: the suffix must be :bn or :nobn")
        items.append((name, None if not flag else flag == "bn"))
    return items


def markdown(report: Dict[str, Any]) -> str:
    def mb(b):
        return "-" if b is None else f"{b / 2 ** 20:.1f}"

    def ms(t):
        return "-" if t is None else f"{1000 * t:.1f}"

    def x(r, target=None):
        if r is None:
            return "-"
        s = f"{r:.2f}x"
        return s if target is None else f"{s} {'✓' if r <= target else '✗'}"

    c = report["config"]
    lines = [
        f"GradInit iteration cost vs one training step — device `{report['device']}`, batch {c['batch_size']} "
        f"(|S| = |S~| = {c['batch_size']}), {c['image_size']}x{c['image_size']} images, width {c['width']}, "
        f"median of {c['repeats']} run(s), torch {report['torch']}.",
        "",
        "| model | BN | train ms | objective ms | constraint ms | train MiB | objective MiB | constraint MiB "
        "| obj/train time (≤2.1) | obj/train mem (≤1.3) | cons/train time (≤3) | cons/train mem |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        q = r["ratios"]
        lines.append(
            f"| {r['model']} | {'yes' if r['bn'] else 'no'} | {ms(r['train']['time_s'])} | {ms(r['objective']['time_s'])} "
            f"| {ms(r['constraint']['time_s'])} | {mb(r['train']['peak_bytes'])} | {mb(r['objective']['peak_bytes'])} "
            f"| {mb(r['constraint']['peak_bytes'])} | {x(q['objective_time'], TARGETS['objective_time'])} "
            f"| {x(q['objective_memory'], TARGETS['objective_memory'])} "
            f"| {x(q['constraint_time'], TARGETS['constraint_time'])} | {x(q['constraint_memory'])} |")
    fd_rows = [r for r in report["results"] if "constraint_fd" in r]
    if fd_rows:
        lines += ["", "Constraint iteration with `constraint_grad=\"finite_difference\"` (approximate; same target):", "",
                  "| model | BN | constraint FD ms | constraint FD MiB | cons FD/train time (≤3) | CPU-time ratio |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {'yes' if r['bn'] else 'no'} | {ms(r['constraint_fd']['time_s'])} "
                  f"| {mb(r['constraint_fd']['peak_bytes'])} "
                  f"| {x(r['ratios']['constraint_fd_time'], TARGETS['constraint_time'])} "
                  f"| {x(r['ratios']['constraint_fd_cpu_time'])} |" for r in fd_rows]
    lines += ["", f"Peak memory: {report['memory_method']}.", "",
              "CPU-time ratios (process CPU time, less sensitive to other load on a shared machine): "
              + "; ".join(f"{r['model']}{'' if r['bn'] else ' (no BN)'}: objective "
                          f"{x(r['ratios']['objective_cpu_time'])}, constraint {x(r['ratios']['constraint_cpu_time'])}"
                          for r in report["results"])]
    return "\n".join(lines) + "\n"


def main(args) -> Dict[str, Any]:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    results = []
    for name, bn in parse_models(args.models):
        logger.info("benchmarking %s (bn=%s) on %s", name, bn, device)
        r = bench_model(name, bn, args, device)
        logger.info("%s: train %.1f ms | objective %.2fx time %.2fx mem | constraint %.2fx time", name,
                    1000 * r["train"]["time_s"], r["ratios"]["objective_time"] or float("nan"),
                    r["ratios"]["objective_memory"] or float("nan"), r["ratios"]["constraint_time"] or float("nan"))
        results.append(r)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "torch": torch.__version__,
        "config": {k: v for k, v in vars(args).items()},
        "targets": TARGETS,
        "memory_method": results[0]["train"]["memory_method"] if results else None,
        "results": results,
    }
    json_path, md_path = Path(args.out + ".json"), Path(args.out + ".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1))
    md_path.write_text(markdown(report))
    logger.info("wrote %s and %s", json_path, md_path)
    return report


if __name__ == "__main__":
    main(get_args_parser().parse_args())
