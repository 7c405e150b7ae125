"""GradInit against the network's own initialization, side by side, for a short training budget.

``gradinit-compare-vision`` trains the same network from the same seed on the same batches twice with
``gradinit-train-vision`` (:mod:`fairseq_gradinit.tools.train_vision`): once from Kaiming's initialization
and once after GradInit. It prints the test accuracy of each after the budget, and writes a JSON with the
numbers and training curves and a PNG plot of the training loss and accuracy by step. The default is VGG-19
with BN at a quarter of the paper's width on Fashion-MNIST from the Debian package ``dataset-fashion-mnist``,
120 steps of 128 images, a budget sized for a CPU (the GradInit paper's Table 1 compares the first epoch of the
same network on CIFAR-10). ``--model resnet110 --no-bn`` is the deep network without normalization, where
Kaiming's initialization does not train at all at lr 0.1.

Flags this command does not know go to both runs (e.g. ``--lr 0.05`` or ``--wd 0``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..command_line.argtypes import float_in, positive_int
from ..command_line.quiet import quiet_command
from ..core.progress import format_duration
from ..files.locks import FolderBusy, folder_lock
from ..files.paths import OutputError, check_output, json_result, png_metadata, png_output, write_json
from .train_vision.cli import get_args_parser as train_parser
from .train_vision.cli import main as train_main
from .train_vision.cli import name_too_long, seed
from .train_vision.data import DATASETS
from .train_vision.errors import Interrupted, RunFailure, UsageError
from .train_vision.loop import RUN_FILES, run_writer

logger = logging.getLogger("compare_vision")
COMMAND = "gradinit-compare-vision"

INITS = ("kaiming", "gradinit")
#: Environment variables that choose PyTorch's, oneDNN's and MKL's CPU kernels (recorded with a run).
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")
LABELS = {"kaiming": "Kaiming init", "gradinit": "GradInit"}
#: The stored runs of the default command, one per machine measured: the README states their range, and a run
#: with the same settings prints its own numbers beside it.
STORED_RUNS = tuple(Path(__file__).resolve().parents[2] / "docs" / name
                    for name in ("compare-vision.json", "compare-vision-epyc.json"))
#: What the accuracies depend on besides the machine: stored runs are compared only where these agree.
SETTINGS = ("model", "bn", "width", "dataset", "batch_size", "steps", "gradinit_iters", "seed", "extra_flags")
DATASET_NAMES = {"fashion-mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "synthetic": "synthetic images",
                 "imagefolder": "an image folder"}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Train a network from Kaiming's initialization and after GradInit for the same short budget; "
        "print the test accuracy of each and write a JSON and a PNG plot. Other gradinit-train-vision flags "
        "(e.g. --lr, --synthetic-train-size) apply to both runs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--dataset", default="fashion-mnist", choices=DATASETS, help="training data (fashion-mnist: "
                   "apt-get install dataset-fashion-mnist)")
    p.add_argument("--data-dir", default=None, help="folder of the data (default: gradinit-train-vision's)")
    p.add_argument("--model", default="vgg19", help="registered architecture")
    p.add_argument("--bn", default=True, action=argparse.BooleanOptionalAction,
                   help="with or without BN layers (without: learnable biases instead)")
    p.add_argument("--width", default=0.25, type=float_in(0.0, low_open=True), help="channel-width multiplier")
    p.add_argument("--batch-size", default=128, type=positive_int, help="training batch size (also GradInit's |S|)")
    p.add_argument("--steps", default=120, type=positive_int, help="training steps of each run (one cosine "
                   "schedule; at most one pass over the training data)")
    p.add_argument("--gradinit-iters", default=39, type=positive_int, help="GradInit iterations")
    p.add_argument("--test-batches", default=10, type=positive_int, help="test batches of 256 images scored after training")
    p.add_argument("--log-interval", default=10, type=positive_int, help="a point of the curves every this many steps")
    p.add_argument("--seed", default=0, type=seed, help="random seed of both runs")
    p.add_argument("--output-dir", default="runs/compare-vision", help="the two runs' folders (kaiming/, "
                   "gradinit/) and, unless --json/--plot say otherwise, compare.json and compare.png")
    p.add_argument("--json", default=None, help="where the comparison's JSON goes (default: OUTPUT_DIR/compare.json)")
    p.add_argument("--plot", default=None, help="where the PNG plot goes (default: OUTPUT_DIR/compare.png)")
    return p


def arm_argv(args, init: str, extra: Sequence[str]) -> List[str]:
    """The gradinit-train-vision command line of one run."""
    argv = ["--dataset", args.dataset, "--model", args.model, "--bn" if args.bn else "--no-bn",
            "--width", str(args.width), "--batch-size", str(args.batch_size), "--epochs", "1",
            "--limit-train-batches", str(args.steps), "--limit-test-batches", str(args.test_batches),
            "--log-interval", str(args.log_interval), "--seed", str(args.seed), "--workers", "0",
            "--init", init, "--output-dir", str(Path(args.output_dir) / init)]
    if run_writer(Path(args.output_dir) / init) == COMMAND:  # its own earlier run, and only that, is replaced
        argv.append("--overwrite")
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    if init == "gradinit":
        argv += ["--gradinit-iters", str(args.gradinit_iters)]
    return argv + list(extra)


def check_names(args) -> None:
    """Before the output folder is locked: no path this command or its runs write has a name longer than
    the file system allows (:class:`UsageError`), which would otherwise be found when it is first written,
    for ``--json``/``--plot`` after both runs."""
    json_path, png_path = output_paths(args)
    paths = [("--output-dir", Path(args.output_dir), True)]
    paths += [("--output-dir", Path(args.output_dir) / init, True) for init in INITS]
    paths += [("--json", json_path, False), ("--plot", png_path, False)]
    for flag, path, locked in paths:
        problem = name_too_long(flag, path, locked=locked)
        if problem:
            raise UsageError(problem)


def check_outputs(args) -> None:
    """Before any training: each run's folder is empty or holds a run of this command (a
    gradinit-train-vision run or other files there are never replaced), and ``--json``/``--plot`` are new
    or this command's own files (:mod:`fairseq_gradinit.files.paths`); :class:`UsageError` otherwise."""
    for init in INITS:
        folder = Path(args.output_dir) / init
        present = [n for n in RUN_FILES if (folder / n).exists()]
        writer = run_writer(folder)
        if present and writer != COMMAND:
            whose = f"a run of {writer}" if writer else f"{', '.join(present)}, which {COMMAND} did not write"
            raise UsageError(f"--output-dir {args.output_dir}: {folder} holds {whose}; {COMMAND} replaces only its own "
                             "runs: give --output-dir another path, or move that folder away yourself")
    json_path, png_path = output_paths(args)
    for flag, path, suffix in (("--json", json_path, ".json"), ("--plot", png_path, ".png")):
        if str(getattr(args, flag[2:]) or "").endswith(("/", os.sep)) or Path(path).is_dir():
            raise UsageError(f"{flag} {path} is a folder; give the file to write, e.g. "
                             f"{os.path.join(str(path), 'compare' + suffix)}")
        if Path(path).suffix.lower() != suffix:
            raise UsageError(f"{flag} {path}: {COMMAND} writes a {suffix[1:].upper()} file there; give a name ending "
                             f"in {suffix}")
    inputs = {"--data-dir": args.data_dir}
    try:
        check_output("--json", json_path, json_result("a comparison of gradinit-compare-vision", "runs", "title",
                                                      command=COMMAND), inputs=inputs)
        check_output("--plot", png_path, png_output(COMMAND), inputs={**inputs, "--json": json_path})
    except OutputError as e:
        raise UsageError(str(e)) from None


def output_paths(args):
    """(the comparison's JSON, its PNG plot)."""
    out = Path(args.output_dir)
    return (Path(args.json) if args.json else out / "compare.json"), (Path(args.plot) if args.plot else out / "compare.png")


def run_arm(targs) -> Dict[str, Any]:
    """Train one run (``gradinit-train-vision``'s parsed arguments); returns its summary (test accuracy,
    times, curves)."""
    start = time.perf_counter()
    log = train_main(targs, command=COMMAND)
    elapsed = time.perf_counter() - start
    last, info = log["epochs"][-1], log["init"]
    branches = {k: info[f"num_{k}"] for k in ("objective", "constraint", "skipped")} if "iterations" in info else None
    return {
        "test_acc": last["test_acc"], "test_loss": last["test_loss"], "train_loss": last["train_loss"],
        "train_acc": last["train_acc"], "steps": log["steps_per_epoch"], "test_images": log["test_images"],
        "init_wall_time": log.get("init_wall_time"), "train_wall_time": last["train_time"],
        "eval_wall_time": last["eval_time"], "wall_time": elapsed, "gradinit_iterations": branches,
        "health": (info.get("health") or {}).get("verdict"),
        "health_reasons": (info.get("health") or {}).get("reasons"),
        "phase": (info.get("health") or {}).get("phase"),
        "curve": [{k: r[k] for k in ("step", "loss", "acc")} for r in log.get("steps", [])],
        "output_dir": targs.output_dir,
    }


def describe(args, steps: int, test_images: int) -> str:
    """One line naming the experiment, for the printout and the plot's title."""
    net = f"{args.model} {'with' if args.bn else 'without'} BN (width {args.width:g})"
    data = DATASET_NAMES.get(args.dataset, args.dataset)
    return f"{net} on {data}: {steps} steps of {args.batch_size} images, test accuracy on {test_images} images"


def cpu_model() -> Optional[str]:
    """The CPU's model name (Linux), else None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def conditions() -> Dict[str, Any]:
    """What the timings depend on, and the CPU kernels the numbers depend on (another CPU or kernel set
    adds rounding differences that 120 training steps grow into other accuracies)."""
    return {"torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_model": cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}}


def report_lines(result: Dict[str, Any]) -> List[str]:
    """The comparison as the command prints it."""
    arms = result["runs"]
    lines = [result["title"], f"{'init':<14}{'test acc':>10}{'test loss':>11}{'init time':>11}{'training':>10}"]
    for init, r in arms.items():
        init_time = "-" if r["init_wall_time"] is None else f"{r['init_wall_time']:.0f}s"
        lines.append(f"{LABELS[init]:<14}{r['test_acc']:>9.1f}%{r['test_loss']:>11.3f}{init_time:>11}"
                     f"{r['train_wall_time']:>9.0f}s")
    if set(INITS) <= set(arms):
        diff = arms["gradinit"]["test_acc"] - arms["kaiming"]["test_acc"]
        lines.append(f"GradInit - Kaiming: {diff:+.1f} points of test accuracy after {result['steps']} steps "
                     f"(total {result['wall_time']:.0f}s on {result['conditions']['torch_threads']} thread(s))")
    return lines


def stored_results(paths: Sequence[Path] = STORED_RUNS) -> List[Dict[str, Any]]:
    """The stored comparisons that are at hand (none outside a checkout of the repository)."""
    out = []
    for path in paths:
        try:
            out.append(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return [r for r in out if isinstance(r.get("runs"), dict) and set(INITS) <= set(r["runs"])]


def payoff_range(results: Sequence[Dict[str, Any]], like: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """Each run's test accuracy and GradInit's gain as ``(lowest, highest)`` over ``results`` (those with the
    settings of ``like`` where it is given); None when there is none."""
    if like is not None:
        results = [r for r in results if all(r.get(k) == like.get(k) for k in SETTINGS)]
    if not results:
        return None
    acc = {init: [r["runs"][init]["test_acc"] for r in results] for init in INITS}
    gains = [g - k for g, k in zip(acc["gradinit"], acc["kaiming"])]
    return {"machines": len(results), **{init: (min(v), max(v)) for init, v in acc.items()},
            "gain": (min(gains), max(gains))}


def payoff_line(rng: Dict[str, Any]) -> str:
    """The range as one sentence: accuracies and the gain, which is what holds across machines."""
    def span(lo: float, hi: float, fmt: str) -> str:
        return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}} to {hi:{fmt}}"
    n = rng["machines"]
    return (f"Kaiming {span(*rng['kaiming'], '.1f')} %, GradInit {span(*rng['gradinit'], '.1f')} %, "
            f"GradInit's gain {span(*rng['gain'], '+.1f')} points ({n} machine{'s' if n > 1 else ''} measured)")


def result_table(result: Dict[str, Any]) -> str:
    """The comparison as a Markdown table (the quick start's page quotes it from the stored JSON)."""
    lines = ["| initialization | test accuracy | test loss | initialization time | training time |", "|---|---|---|---|---|"]
    for init, r in result["runs"].items():
        init_time = "-" if r["init_wall_time"] is None else f"{r['init_wall_time']:.0f} s"
        lines.append(f"| {LABELS[init]} | {r['test_acc']:.1f} % | {r['test_loss']:.3f} | {init_time} | "
                     f"{r['train_wall_time']:.0f} s |")
    threads = result["conditions"]["torch_threads"]
    lines += ["", f"Both runs, GradInit included, took {format_duration(result['wall_time'])} on {threads} "
              f"thread{'' if threads == 1 else 's'}."]
    return "\n".join(lines)


def plot(result: Dict[str, Any], path: Path) -> bool:
    """Training loss and accuracy by step of both runs, test accuracies in the legend. False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no PNG plot", file=sys.stderr)
        return False
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 5))
    for i, (init, r) in enumerate(result["runs"].items()):
        steps = [p["step"] for p in r["curve"]]
        label = f"{LABELS[init]}: test accuracy {r['test_acc']:.1f} %"
        ax_loss.plot(steps, [p["loss"] for p in r["curve"]], color=f"C{i}", lw=2, label=label)
        ax_acc.plot(steps, [p["acc"] for p in r["curve"]], color=f"C{i}", lw=2, label=label)
    losses = [p["loss"] for r in result["runs"].values() for p in r["curve"] if p["loss"] > 0]
    log_scale = bool(losses) and max(losses) > 20 * min(losses)  # Kaiming's exploding start without BN
    if log_scale:
        ax_loss.set_yscale("log")
    ax_loss.set_ylabel("training loss" + (" (log scale)" if log_scale else ""), fontsize=13)
    ax_acc.set_ylabel("training accuracy (%)", fontsize=13)
    for ax in (ax_loss, ax_acc):
        ax.set_xlabel(f"training step (batch of {result['batch_size']})", fontsize=13)
        ax.tick_params(labelsize=11)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=12)
    fig.suptitle(f"GradInit vs Kaiming initialization\n{result['title']}", fontsize=14)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata=png_metadata(COMMAND))
    plt.close(fig)
    return True


def compare(args, extra: Sequence[str]) -> Dict[str, Any]:
    """Both runs, one after the other; the comparison's record."""
    check_outputs(args)
    parser = train_parser()
    parser.prog = COMMAND
    arms = {init: parser.parse_args(arm_argv(args, init, extra)) for init in INITS}  # both checked first
    load_before = load_average()
    start = time.perf_counter()
    runs = {init: run_arm(targs) for init, targs in arms.items()}
    steps = runs["kaiming"]["steps"]
    return {"title": describe(args, steps, runs["kaiming"]["test_images"]), "model": args.model, "bn": args.bn,
            "width": args.width, "dataset": args.dataset, "batch_size": args.batch_size, "steps": steps,
            "gradinit_iters": args.gradinit_iters, "seed": args.seed, "extra_flags": list(extra),
            "wall_time": time.perf_counter() - start,
            "conditions": {**conditions(), "load_average_1min": [load_before, load_average()]}, "runs": runs}


def load_average() -> Optional[float]:
    """The 1-minute load average (other programs' demand for the CPU, which the times depend on), else None."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = get_args_parser()
    args, extra = parser.parse_known_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    try:
        check_names(args)
        with folder_lock(args.output_dir, flag="--output-dir", command=COMMAND):
            result = compare(args, extra)
            json_path, png_path = output_paths(args)
            write_json(json_path, result, command=COMMAND)
            plotted = plot(result, png_path)
    except (UsageError, RunFailure, FolderBusy) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except (Interrupted, KeyboardInterrupt):
        return 130
    print("\n".join(report_lines(result)))
    stored = payoff_range(stored_results(), like=result)
    if stored:
        print(f"stored runs with these settings: {payoff_line(stored)}")
    print(f"curves and numbers: {json_path}" + (f"; plot: {png_path}" if plotted else ""))
    return 0


run = quiet_command(main, COMMAND)
