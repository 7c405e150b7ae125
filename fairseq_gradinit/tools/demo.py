"""The first thing to run: GradInit against no GradInit on the shipped translation corpus, in minutes.

``gradinit-demo`` unpacks ``data/debian-ui-de-en.tar.xz`` (human-translated Debian UI strings), prepares it
(SentencePiece, binarization), and trains the quick start's Post-LN Transformer twice at once without
learning-rate warmup, one process per core: from fairseq's initialization (Xavier) and after a short GradInit
phase. It prints both validation losses and both source gaps (how much worse the model does when each
sentence is paired with another sentence's source: near 0 bits, the model ignores its source), and writes
``demo.json`` and a plot. Everything goes under ``--out`` (default ``runs/demo``); a second run reuses the
prepared data.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..core.progress import format_duration
from .curves import parse_training_log, plot_panels
from ..files.locks import FolderBusy, folder_lock
from ..files.paths import OutputError, check_output, json_result, png_output, write_json
from ..command_line.quiet import quiet_command
from .user_dir import user_dir

COMMAND = "gradinit-demo"
CORPUS = "debian-ui-de-en"
ARCHIVE = f"data/{CORPUS}.tar.xz"
#: The quick start's model (README), smaller batches so that a 2-core CPU sees its first hundreds of updates
#: in minutes.
MODEL_ARGS = (
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "6", "--decoder-layers", "6",
    "--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
    "--decoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--share-all-embeddings", "--dropout", "0.3", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3",
    "--lr-scheduler", "fixed",
)
ARMS = {"xavier": "no GradInit (Xavier), no warmup", "gradinit": "GradInit, no warmup"}
#: A model whose source gap stays below this many bits per token ignores its source (the training
#: monitor's threshold, docs/monitor.md).
GAP_IGNORES_SOURCE = 0.25
#: The stored demo runs the printout compares with (one ``demo.json`` per machine measured), in the repository.
STORED_RUNS = Path(__file__).resolve().parents[2] / "docs" / "demo-runs"


class DemoError(RuntimeError):
    """A problem the user can fix (bad option, occupied output folder, missing corpus): one line."""


@dataclass(frozen=True)
class DemoPlan:
    """What the demo trains, resolved once from the command line."""

    out: Path
    corpus: Path
    updates: int
    gradinit_iters: int
    valid_every: int
    max_tokens: int
    valid_batches: int
    seed: int
    vocab_size: int

    def train_argv(self, arm: str, data_bin: Path) -> List[str]:
        """``fairseq-train``'s arguments for one arm."""
        argv = [str(data_bin), "--user-dir", user_dir(), "--task", "translation_gradinit", *MODEL_ARGS,
                "--cpu", "--seed", str(self.seed), "--max-tokens", str(self.max_tokens),
                "--max-update", str(self.updates), "--validate-interval-updates", str(self.valid_every),
                "--validate-interval", "1000000", "--max-valid-steps", str(self.valid_batches),
                "--log-interval", str(max(1, min(25, self.valid_every))), "--log-format", "simple",
                "--no-progress-bar", "--no-save", "--num-workers", "0",
                "--save-dir", str(self.out / arm), "--gradinit-source-gap", "on"]
        if arm == "gradinit":
            argv += ["--gradinit-iters", str(self.gradinit_iters), "--gradinit-log-interval", "1"]
        return argv


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=COMMAND,
        description="GradInit against no GradInit on the shipped translation corpus, both without warmup: "
                    "prints the validation losses and source gaps and writes a plot (a few minutes on 2 cores).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/demo"),
                   help="folder for the corpus, the prepared data, both runs, demo.json and demo.png")
    p.add_argument("--corpus", type=Path, default=None,
                   help=f"the corpus archive or its unpacked folder (default: {ARCHIVE} in the current folder or "
                        "in the checkout this package was installed from)")
    p.add_argument("--updates", type=positive, default=160, help="training updates of each run")
    p.add_argument("--gradinit-iters", type=positive, default=20, help="GradInit iterations before training")
    p.add_argument("--valid-every", type=positive, default=50, help="updates between validations")
    p.add_argument("--valid-batches", type=positive, default=4,
                   help="validation batches scored at each validation (a fixed part of the validation set)")
    p.add_argument("--max-tokens", type=positive, default=2048, help="tokens per batch")
    p.add_argument("--seed", type=int, default=1, help="the seed of both runs")
    p.add_argument("--vocab-size", type=positive, default=6000, help="SentencePiece pieces (joint)")
    return p


def find_corpus(given: Optional[Path]) -> Path:
    """The archive or folder to use; :class:`DemoError` naming where it looked."""
    if given is not None:
        if not given.exists():
            raise DemoError(f"--corpus {given} does not exist; give {ARCHIVE} or its unpacked folder")
        return given
    candidates = [Path(ARCHIVE), STORED_RUNS.parents[1] / ARCHIVE]
    for path in candidates:
        if path.is_file():
            return path
    raise DemoError(f"no corpus: looked for {' and '.join(str(c) for c in candidates)}; run {COMMAND} from the "
                    "repository's folder or give --corpus")


def check_out(out: Path) -> None:
    """The output folder is new, empty or this command's own: nothing of the user's is replaced."""
    if out.exists() and not out.is_dir():
        raise DemoError(f"--out {out} is a file; give a folder")
    if out.is_dir():
        own = {"corpus", "data", *ARMS, "demo.json", "demo.png", ".lock"}
        other = sorted(p.name for p in out.iterdir() if p.name not in own and not p.name.startswith(".gradinit"))
        if other:
            raise DemoError(f"--out {out} holds files {COMMAND} did not write ({', '.join(other[:3])}); give another "
                            "folder")
    try:
        check_output("--out", out / "demo.json", json_result("a gradinit-demo result", "arms", command=COMMAND))
        check_output("--out", out / "demo.png", png_output(COMMAND))
    except OutputError as e:
        raise DemoError(str(e)) from None


def unpack(corpus: Path, out: Path) -> Path:
    """The corpus folder: ``corpus`` itself, or the archive unpacked under ``out/corpus`` (once)."""
    if corpus.is_dir():
        return corpus
    folder = out / "corpus" / CORPUS
    if not (folder / "test.en").is_file():
        print(f"[demo] unpacking {corpus}", flush=True)
        with tarfile.open(corpus) as tar:
            tar.extractall(out / "corpus", filter="data")
    if not (folder / "train.de").is_file():
        raise DemoError(f"{corpus} did not hold {CORPUS}/train.de; give the shipped archive {ARCHIVE}")
    return folder


def prepare(corpus_dir: Path, out: Path, vocab_size: int) -> Path:
    """The data-bin, prepared once per corpus and vocabulary size (SentencePiece, as in the quick start)."""
    data = out / "data"
    try:
        summary = json.loads((data / "prepare_corpus.json").read_text(encoding="utf-8"))
        same = (summary.get("spm_vocab_size") == vocab_size
                and Path(summary.get("corpus_dir", "")).resolve() == corpus_dir.resolve())
    except (OSError, ValueError, AttributeError):
        same = False
    if not same:
        from .prepare_corpus import main as prepare_main

        print("[demo] preparing the corpus (SentencePiece, binarization)", flush=True)
        rc = prepare_main([str(corpus_dir), "--src", "de", "--tgt", "en", "--vocab-size", str(vocab_size), "--out", str(data),
                           "--quiet", "--overwrite"])
        if rc != 0:
            raise DemoError(f"preparing {corpus_dir} failed (exit {rc}); see the lines above")
    return data / "bin"


class Run:
    """One ``fairseq-train`` process and what its log says so far."""

    def __init__(self, name: str, argv: List[str], folder: Path):
        self.name, self.folder, self.log = name, folder, folder / "train.log"
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        with open(self.log, "w", encoding="utf-8") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "fairseq_cli.train", *argv], stdout=log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started = time.monotonic()
        self.phase: Optional[tuple] = None  # (done, total)
        self.update = 0
        self.train_started: Optional[float] = None

    def poll_log(self) -> None:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            if "gradinit iter " in line:
                done, _, total = line.split("gradinit iter ", 1)[1].split(" ", 1)[0].partition("/")
                if done.isdigit() and total.isdigit():
                    self.phase = (int(done), int(total))
            elif "num_updates" in line:
                for part in line.replace(",", " |").split("|"):
                    key, _, value = part.strip().replace("=", " ").partition(" ")
                    if key == "num_updates" and value.strip().isdigit():
                        if self.train_started is None:
                            self.train_started = time.monotonic()
                        self.update = max(self.update, int(value.strip()))

    def status(self, updates: int) -> str:
        if self.update == 0 and self.phase:
            return f"{self.name}: GradInit {self.phase[0]}/{self.phase[1]}"
        return f"{self.name}: update {self.update}/{updates}"


def eta(runs: Sequence[Run], plan: DemoPlan) -> Optional[float]:
    """Seconds until both runs end, from the rates seen so far (None before any rate is known)."""
    now = time.monotonic()
    rates = [r.update / (now - r.train_started) for r in runs if r.train_started and r.update > 0]
    if not rates:
        return None
    per_update = 1.0 / min(rates)
    left = []
    for r in runs:
        rest = (plan.updates - r.update) * per_update
        if r.update == 0 and r.phase and r.phase[0] > 0:
            per_iter = (now - r.started) / r.phase[0]
            rest += (r.phase[1] - r.phase[0]) * per_iter
        left.append(rest)
    return max(left)


def train(plan: DemoPlan, data_bin: Path) -> Dict[str, Path]:
    """Both runs at once, with a progress line every few seconds; the logs by arm."""
    runs = [Run(arm, plan.train_argv(arm, data_bin), plan.out / arm) for arm in ARMS]
    start, last_print = time.monotonic(), 0.0
    tty = sys.stdout.isatty()
    try:
        while any(r.proc.poll() is None for r in runs):
            time.sleep(2)
            for r in runs:
                r.poll_log()
            now = time.monotonic()
            if tty or now - last_print >= 20:
                left = eta(runs, plan)
                line = (f"[demo] {' | '.join(r.status(plan.updates) for r in runs)} | {format_duration(now - start)} "
                        f"elapsed" + (f", about {format_duration(left)} left" if left is not None else ""))
                print(("\r" + line.ljust(110)) if tty else line, end="" if tty else "\n", flush=True)
                last_print = now
    except KeyboardInterrupt:
        for r in runs:
            if r.proc.poll() is None:
                os.killpg(r.proc.pid, signal.SIGTERM)
        raise
    if tty:
        print(flush=True)
    failed = [r for r in runs if r.proc.returncode != 0]
    if failed:
        r = failed[0]
        # the log's last lines, each cut to a width a terminal shows (fairseq's carry whole paths and configs)
        tail = [line[:200] for line in r.log.read_text(encoding="utf-8", errors="replace").splitlines()[-5:]]
        raise DemoError(f"the {r.name} run stopped with exit {r.proc.returncode} (log {r.log}):\n  " + "\n  ".join(tail))
    return {r.name: r.log for r in runs}


def collect(logs: Dict[str, Path]) -> Dict[str, dict]:
    """Each arm's validation curves (loss, source gap) and its last values."""
    arms = {}
    for arm, log in logs.items():
        with open(log, encoding="utf-8", errors="replace") as f:
            curves = parse_training_log(f, valid_metrics=("loss", "src_gap"))
        loss, gap = curves["valid_loss"], curves["valid_src_gap"]
        last = max(loss) if loss else None
        arms[arm] = {"label": ARMS[arm], "valid_loss": loss, "src_gap": gap, "last_update": last,
                     "final_loss": loss.get(last) if last else None, "final_src_gap": gap.get(last) if last else None}
    return arms


def reading(arms: Dict[str, dict]) -> List[str]:
    """What the numbers say, in plain words, decided by the numbers."""
    x, g = arms["xavier"], arms["gradinit"]
    if x["final_loss"] is None or g["final_loss"] is None:
        return ["a run logged no validation; see its train.log"]
    lines = []
    diff = x["final_loss"] - g["final_loss"]
    if diff > 0.05:
        lines.append(f"GradInit's run is {diff:.2f} bits per token lower in validation loss after the same updates.")
    elif diff < -0.05:
        lines.append(f"GradInit's run is {-diff:.2f} bits per token higher in validation loss after the same updates.")
    else:
        lines.append("Both runs are within 0.05 bits per token in validation loss.")
    gaps = {a: arms[a]["final_src_gap"] for a in arms}
    if all(v is not None and v < GAP_IGNORES_SOURCE for v in gaps.values()):
        lines.append(f"Neither run uses its source yet (source gaps under {GAP_IGNORES_SOURCE} bits): a lower loss this "
                     "early can be a target-side language model. Whether a model keeps its source shows later.")
    elif gaps["gradinit"] is not None and gaps["gradinit"] < GAP_IGNORES_SOURCE:
        lines.append("GradInit's run does not use its source (gap under 0.25 bits): a lower loss is not a better "
                     "translation model here.")
    lines.append("For translation without warmup, what held and what did not: docs/no-warmup.md.")
    return lines


def stored_runs(folder: Path = STORED_RUNS) -> List[dict]:
    """The stored demo runs at the demo's defaults (none where the checkout's record is not at hand)."""
    runs = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            runs.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return [r for r in runs if isinstance(r.get("arms"), dict) and set(ARMS) <= set(r["arms"])]


#: The plan's fields that the numbers depend on: stored runs are compared only where these agree.
SETTINGS = ("updates", "gradinit_iters", "valid_every", "max_tokens", "valid_batches", "seed", "vocab_size")


def comparable(runs: List[dict], plan: DemoPlan) -> List[dict]:
    """The stored runs made with ``plan``'s settings."""
    return [r for r in runs if all(r.get("plan", {}).get(k) == getattr(plan, k) for k in SETTINGS)]


def _span(values: List[float]) -> str:
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return low if low == high else f"{low}–{high}"


def stored_range(runs: Optional[List[dict]] = None) -> Optional[str]:
    """The stored demo runs' final numbers as a range over the machines measured (None without the record)."""
    runs = stored_runs() if runs is None else runs
    if not runs:
        return None
    parts = []
    for arm in ARMS:
        losses = [r["arms"][arm]["final_loss"] for r in runs]
        gaps = [r["arms"][arm]["final_src_gap"] for r in runs]
        parts.append(f"{ARMS[arm]}: loss {_span(losses)}, gap {_span(gaps)}")
    return f"stored runs ({len(runs)} machine{'s' if len(runs) > 1 else ''}): " + "; ".join(parts)


def table(arms: Dict[str, dict]) -> List[str]:
    lines = [f"{'':34}{'valid loss':>12}{'source gap':>12}  (bits per token, update {arms['xavier']['last_update']})"]
    for a in arms.values():
        loss = "-" if a["final_loss"] is None else f"{a['final_loss']:.3f}"
        gap = "-" if a["final_src_gap"] is None else f"{a['final_src_gap']:.3f}"
        lines.append(f"{a['label']:34}{loss:>12}{gap:>12}")
    return lines


def machine() -> dict:
    """What the numbers and the time depend on: the CPU (its kernels round differently) and its cores."""
    from .compare_vision import cpu_model

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def run_demo(plan: DemoPlan) -> dict:
    start = time.monotonic()
    corpus_dir = unpack(plan.corpus, plan.out)
    data_bin = prepare(corpus_dir, plan.out, plan.vocab_size)
    print(f"[demo] training both runs ({plan.updates} updates each; GradInit first runs {plan.gradinit_iters} "
          "iterations), one core each", flush=True)
    arms = collect(train(plan, data_bin))
    result = {"plan": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(plan).items()},
              "arms": arms, "wall_s": round(time.monotonic() - start, 1), "machine": machine()}
    write_json(plan.out / "demo.json", result, command=COMMAND)
    panels = [("validation loss (bits per token)", {a["label"]: a["valid_loss"] for a in arms.values()}, False),
              ("source gap (bits per token)", {a["label"]: a["src_gap"] for a in arms.values()}, False)]
    result["plot"] = plot_panels(panels, plan.out / "demo.png", title="the quick start's Transformer without warmup",
                                 command=COMMAND)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        corpus = find_corpus(args.corpus)
        check_out(args.out)
        plan = DemoPlan(out=args.out, corpus=corpus, updates=args.updates, gradinit_iters=args.gradinit_iters,
                        valid_every=min(args.valid_every, args.updates), max_tokens=args.max_tokens,
                        valid_batches=args.valid_batches, seed=args.seed,
                        vocab_size=args.vocab_size)
        with folder_lock(args.out, flag="--out", command=COMMAND):
            result = run_demo(plan)
    except (DemoError, FolderBusy) as e:
        print(f"{COMMAND}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{COMMAND}: interrupted; run it again to start the training over (the prepared data is kept)",
              file=sys.stderr)
        return 130
    print("\n".join(table(result["arms"])))
    print("\n".join(reading(result["arms"])))
    stored = stored_range(comparable(stored_runs(), plan))
    print(stored or "(no stored run with these settings to compare with)")
    print(f"took {format_duration(result['wall_s'])}; numbers: {args.out / 'demo.json'}"
          + (f"; plot: {args.out / 'demo.png'}" if result["plot"] else ""))
    return 0


run = quiet_command(main, COMMAND)


if __name__ == "__main__":
    sys.exit(run())
