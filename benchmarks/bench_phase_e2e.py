"""The GradInit phase inside ``fairseq-train``, per token, against the training updates of the same run.

One ``fairseq-train`` run in this process, with the plugin, on the shipped corpus
(``data/debian-ui-de-en.tar.xz``, prepared as the README's quick start prepares it, unless
``--data-bin`` is given) and the quick-start model (6+6 layers, d=128, FFN 512, 4 heads, shared
embeddings, 2048-token batches): a GradInit phase, then ``--updates`` training updates. The phase's
iterations follow a schedule so that every kind is measured: ``--objective-iters`` objective
iterations, ``--constraint-iters`` constraint iterations (the first follows an objective one, the
others a constraint one), then ``--switch-iters`` pairs of one objective and one constraint
iteration. The branch is forced by setting the engine's gamma before each iteration (infinite:
objective; 0: constraint); nothing else of the run changes. ``--schedule natural`` leaves gamma as the
run derives it.

Reported per iteration kind: the wall time of an iteration (from drawing its pair to drawing the next:
its batches, its passes, logging and state saves), the tokens of S and S~ (fairseq's ``ntokens``), the
wall time per token processed (S and S~ for an objective iteration, S for a constraint iteration)
against a training update's wall time per token (from one ``Trainer.train_step`` to the next, its
batch and logging included), and where the time goes: timers around the pair's drawing and
collation, the engine's forward passes (the loss) and backward passes (``torch.autograd.grad``), the
rest of an iteration (the scale bookkeeping), logging, the phase's state saves, the health check's
extra passes, the fingerprint and the result file. After the timed iterations, ``--profile-iters``
iterations of each kind run under ``torch.profiler`` and a host-read counter (``host_syncs.py``); they
are not in the medians. The first ``--warmup`` iterations (the phase's first allocations) and the
first ``--warmup-updates`` updates (Adam's state) are not either.

    python benchmarks/bench_phase_e2e.py --out benchmarks/results           # the quick-start model, CPU
    python benchmarks/bench_phase_e2e.py --tiny --out /tmp/phase_e2e        # seconds, for the tests
    python benchmarks/bench_phase_e2e.py --device cuda --embed-dim 512 --ffn-dim 1024 --max-tokens 4096
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "debian-ui-de-en.tar.xz"

#: The quick start's model and batches (README.md, step 2).
QUICK_START = dict(layers=6, embed_dim=128, ffn_dim=512, heads=4, max_tokens=2048, vocab=6000)
TINY = dict(layers=1, embed_dim=16, ffn_dim=32, heads=2, max_tokens=300, vocab=0, objective_iters=3,
            constraint_iters=3, switch_iters=2, updates=4, warmup=1, warmup_updates=1, profile_iters=1,
            corpus_lines=300)
KINDS = ("objective", "constraint", "constraint_after_objective")
#: Sections of the phase's wall time, each timed exclusively of the sections inside it.
SECTIONS = ("data", "collate", "forward", "backward", "bookkeeping", "logging", "state_save", "health",
            "snapshot", "fingerprint", "batch_plan", "result_write", "profiler", "phase_other")


def get_args_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--data-bin", help="a fairseq translation data-bin with a joint dictionary (default: the "
                                      "shipped corpus, prepared into --work-dir as the quick start does)")
    p.add_argument("--work-dir", help="where the prepared corpus is kept between runs (default: a folder under "
                                      "the system's temporary directory)")
    p.add_argument("--layers", type=int, default=QUICK_START["layers"])
    p.add_argument("--embed-dim", type=int, default=QUICK_START["embed_dim"])
    p.add_argument("--ffn-dim", type=int, default=QUICK_START["ffn_dim"])
    p.add_argument("--heads", type=int, default=QUICK_START["heads"])
    p.add_argument("--max-tokens", type=int, default=QUICK_START["max_tokens"])
    p.add_argument("--objective-iters", type=int, default=12)
    p.add_argument("--constraint-iters", type=int, default=12)
    p.add_argument("--switch-iters", type=int, default=4, help="pairs of one objective and one constraint iteration")
    p.add_argument("--schedule", choices=["forced", "natural"], default="forced",
                   help="forced: the branch of each iteration by the schedule above; natural: as gamma decides")
    p.add_argument("--warmup", type=int, default=1, help="first iterations left out of the medians")
    p.add_argument("--updates", type=int, default=14, help="training updates after the phase")
    p.add_argument("--warmup-updates", type=int, default=2, help="first updates left out of the medians")
    p.add_argument("--profile-iters", type=int, default=1,
                   help="iterations of each kind profiled after the timed ones (0: none)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tiny", action="store_true", help="a 1+1-layer d=16 model on 300 sentences, a few iterations "
                                                       "and updates (a test of the script, seconds on a CPU)")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output directory")
    p.add_argument("--tag", help="output file name (default phase_e2e_<device>[_tiny])")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                   help="further fairseq-train arguments, after everything else")
    return p


def usage_error(message: str):
    print(f"bench_phase_e2e.py: error: {message}", file=sys.stderr)  # noqa: T201
    raise SystemExit(2)


def apply_tiny(args) -> None:
    for k, v in TINY.items():
        if k != "vocab" and k != "corpus_lines":
            setattr(args, k, v)


# -- the data --------------------------------------------------------------------------------------
def prepared_data_bin(args) -> Path:
    """The data-bin of the run: ``--data-bin``, or the shipped corpus prepared in ``--work-dir``
    (sentencepiece, 6000 pieces, as the quick start; ``--tiny``: its first sentences as whitespace tokens)."""
    if args.data_bin:
        return Path(args.data_bin)
    work = Path(args.work_dir or Path(tempfile.gettempdir()) / "gradinit-bench-phase-e2e")
    target = work / ("tiny" if args.tiny else "debian-ui-de-en") / "bin"
    if (target / "dict.de.txt").exists():
        return target
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(CORPUS, "r:xz") as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    raw = work / ("tiny-raw" if args.tiny else "debian-ui-de-en-raw")
    raw.mkdir(exist_ok=True)
    for name, data in files.items():
        if args.tiny:
            data = b"".join(line + b"\n" for line in data.split(b"\n")[:TINY["corpus_lines"]])
        (raw / name).write_bytes(data)
    if args.tiny:
        from fairseq import options
        from fairseq_cli import preprocess

        preprocess.main(options.get_preprocessing_parser().parse_args([
            "--source-lang", "de", "--target-lang", "en", "--trainpref", str(raw / "train"),
            "--validpref", str(raw / "valid"), "--destdir", str(target), "--joined-dictionary",
            "--nwordssrc", "600", "--workers", "1"]))
        return target
    cmd = [sys.executable, str(REPO / "scripts" / "prepare_corpus.py"), str(raw), "--src", "de", "--tgt", "en",
           "--vocab-size", str(QUICK_START["vocab"]), "--out", str(target.parent)]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep +
                                         os.environ.get("PYTHONPATH", "")})
    return target


def train_argv(args, data_bin: Path, save_dir: Path, iters: int) -> List[str]:
    """The README quick start's fairseq-train command at this size, with the schedule's iterations."""
    argv = [
        str(data_bin), "--user-dir", str(REPO / "fairseq_gradinit"), "--task", "translation_gradinit",
        "--arch", "transformer_iwslt_de_en", "--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers),
        "--encoder-embed-dim", str(args.embed_dim), "--decoder-embed-dim", str(args.embed_dim),
        "--encoder-ffn-embed-dim", str(args.ffn_dim), "--decoder-ffn-embed-dim", str(args.ffn_dim),
        "--encoder-attention-heads", str(args.heads), "--decoder-attention-heads", str(args.heads),
        "--share-all-embeddings", "--dropout", "0.3",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "fixed",
        "--max-tokens", str(args.max_tokens), "--max-update", str(args.updates), "--save-dir", str(save_dir),
        "--gradinit-iters", str(iters), "--gradinit-lr", "1e-2",
        # the paper's single simulated step: the iteration kinds measured are the paper's (the plugin's Adam
        # default simulates four steps, each beyond the first one more pass of an objective iteration)
        "--gradinit-lookahead-steps", "1",
        # the benchmark's own: no checkpoint or validation after the updates, one log line per 10 updates
        "--no-save", "--disable-validation", "--log-format", "simple", "--log-interval", "10",
        "--no-progress-bar", "--num-workers", "0", "--seed", str(args.seed),
    ]
    if args.device == "cpu":
        argv.append("--cpu")
    return argv + list(args.extra)


def schedule(args, *, tail: bool = True) -> List[str]:
    """The forced branch of each iteration ('O', 'C'): the timed ones, then (``tail``) ``--profile-iters``
    times one of each kind under torch.profiler and once more one of each under the host-read counter."""
    timed = ["O"] * args.objective_iters + ["C"] * args.constraint_iters + ["O", "C"] * args.switch_iters
    if not tail or not args.profile_iters:
        return timed
    return timed + ["O", "C", "C"] * (args.profile_iters + 1)


# -- the timers ------------------------------------------------------------------------------------
class Clock:
    """Exclusive wall time per section: a section's time excludes the sections opened inside it. On
    CUDA the sections are host times (no synchronization inside an iteration, which would change what
    is measured); iterations and updates are timed between synchronizations."""

    def __init__(self):
        self.stack: List[list] = []  # [name, start, time of inner sections]
        self.total: Dict[str, float] = {k: 0.0 for k in SECTIONS}
        self.calls: Dict[str, int] = {k: 0 for k in SECTIONS}

    @property
    def top(self) -> Optional[str]:
        return self.stack[-1][0] if self.stack else None

    @contextlib.contextmanager
    def section(self, name: str):
        self.stack.append([name, time.perf_counter(), 0.0])
        try:
            yield
        finally:
            _, start, inner = self.stack.pop()
            spent = time.perf_counter() - start
            self.total[name] = self.total.get(name, 0.0) + spent - inner
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.stack:
                self.stack[-1][2] += spent


class Probe:
    """Patches the plugin, the engine and fairseq's trainer in this process to time them (see the
    module docstring), and forces the schedule's branches."""

    def __init__(self, args, device):
        self.args = args
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(self.device)) if cuda else (lambda: None)
        self.clock = Clock()
        self.plan = schedule(args) if args.schedule == "forced" else None
        self.iterations: List[dict] = []
        self.updates: List[dict] = []
        self.phase_s = None
        self.in_phase = False
        self.profiles: Dict[str, dict] = {}
        self.host_reads: Dict[str, dict] = {}
        self.timed_iters = len(schedule(args, tail=False))
        self._pair_start = self._pair_cpu_start = None
        self._patches: List[tuple] = []

    def patch(self, owner, name, make):
        original = getattr(owner, name)
        self._patches.append((owner, name, original))
        setattr(owner, name, make(original))

    def timed(self, section, *, only_under=None):
        """A wrapper factory timing calls in ``section`` (while the phase runs; where ``only_under``
        names sections, only calls made directly inside one of them)."""
        def make(fn):
            def wrapper(*a, **kw):
                # the main thread only: on CUDA the pairs are collated on the prefetcher's thread
                if not self.in_phase or threading.current_thread() is not threading.main_thread() or (
                        only_under is not None and self.clock.top not in only_under):
                    return fn(*a, **kw)
                with self.clock.section(section):
                    return fn(*a, **kw)
            return wrapper
        return make

    def _run(self, fn):
        """The task's ``run``: the whole phase."""
        def wrapper(task, *a, **kw):
            self.in_phase = True
            start = time.perf_counter()
            try:
                with self.clock.section("phase_other"):
                    return fn(task, *a, **kw)
            finally:
                self.phase_s = time.perf_counter() - start
                self.in_phase = False
        return wrapper

    def _step(self, fn):
        """``GradInit.step``: the schedule's branch, the iteration's times and tokens, and the profiled tail."""
        def wrapper(eng, pair):
            i = len(eng.history)
            if self.plan is not None and i < len(self.plan):
                eng.state.gamma = math.inf if self.plan[i] == "O" else 0.0
            previous = eng.history[-1].branch if eng.history else None
            tail = i - self.timed_iters if self.plan is not None else -1
            before = dict(self.clock.total)
            self.sync()
            start, cpu_start = time.perf_counter(), time.thread_time()
            prof = reads = None
            with self.clock.section("profiler"), contextlib.ExitStack() as stack:
                if 0 <= tail < 3 * self.args.profile_iters:
                    prof = stack.enter_context(torch.profiler.profile(activities=profiler_activities(self.device)))
                elif tail >= 0:
                    from host_syncs import HostSyncCounter

                    reads = stack.enter_context(HostSyncCounter(self.device))
                with self.clock.section("bookkeeping"):
                    rec = fn(eng, pair)
            self.sync()
            spent, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
            kind = "constraint_after_objective" if rec.branch == "constraint" and previous == "objective" else rec.branch
            delta = {k: self.clock.total[k] - before.get(k, 0.0) for k in self.clock.total}
            self.iterations.append({
                "iteration": i + 1, "kind": kind, "previous": previous, "step_s": spent, "step_cpu_s": cpu,
                "pair_start": self._pair_start, "pair_cpu_start": self._pair_cpu_start, "step_start": start,
                "step_cpu_start": cpu_start, "forward_s": delta["forward"], "backward_s": delta["backward"],
                "bookkeeping_s": delta["bookkeeping"], "tokens_s": _ntokens(pair.s),
                "tokens_s_tilde": _ntokens(pair.s_tilde), "sentences_s": _nsentences(pair.s),
                "sentences_s_tilde": _nsentences(pair.s_tilde), "profiled": tail >= 0})
            if prof is not None:
                self.profiles.setdefault(kind, profile_summary(prof, self.device))
            if reads is not None:
                self.host_reads.setdefault(kind, {"total": reads.total, "by_op": dict(reads.counts)})
            return rec
        return wrapper

    def _next_pair(self, fn):
        """``DevicePrefetcher.__next__``: where an iteration starts (drawing its pair)."""
        def wrapper(it):
            if not self.in_phase:
                return fn(it)
            self.sync()
            self._pair_start, self._pair_cpu_start = time.perf_counter(), time.thread_time()
            with self.clock.section("data"):
                return fn(it)
        return wrapper

    def _train_step(self, fn):
        """fairseq's ``Trainer.train_step``: one training update."""
        def wrapper(trainer, samples, *a, **kw):
            self.sync()
            start, cpu_start = time.perf_counter(), time.thread_time()
            out = fn(trainer, samples, *a, **kw)
            self.sync()
            self.updates.append({"start": start, "cpu_start": cpu_start, "step_s": time.perf_counter() - start,
                                 "step_cpu_s": time.thread_time() - cpu_start,
                                 "tokens": sum(_ntokens(s) for s in samples if s)})
            return out
        return wrapper

    def _loss_factory(self, fn):
        """The loss the task hands the engine: its calls inside an iteration are the forward passes."""
        def wrapper(criterion):
            loss_fn = fn(criterion)

            def timed_loss(model, sample):
                if self.in_phase and self.clock.top == "bookkeeping":
                    with self.clock.section("forward"):
                        return loss_fn(model, sample)
                return loss_fn(model, sample)
            return timed_loss
        return wrapper

    def __enter__(self):
        from fairseq import trainer as fairseq_trainer

        from fairseq_gradinit.core import engine, prefetch
        from fairseq_gradinit.fairseq_plugin.data import batches
        from fairseq_gradinit.fairseq_plugin.phase import compute
        from fairseq_gradinit.fairseq_plugin.registration import hook

        self.patch(hook.GradInitTaskMixin, "run", self._run)
        self.patch(engine.GradInit, "step", self._step)
        self.patch(engine.GradInit, "log_progress", self.timed("logging"))
        self.patch(prefetch.DevicePrefetcher, "__next__", self._next_pair)
        self.patch(batches, "collate", self.timed("collate"))
        self.patch(batches, "training_batch_indices", self.timed("batch_plan"))
        self.patch(hook, "mean_loss_fn", self._loss_factory)
        self.patch(hook, "fingerprint", self.timed("fingerprint"))
        self.patch(compute, "measure_health", self.timed("health"))
        self.patch(compute, "snapshot_weights", self.timed("snapshot"))
        self.patch(compute, "_saved_phase_state", self.timed("state_save"))
        self.patch(compute, "_write", self.timed("result_write"))
        self.patch(torch.autograd, "grad", self.timed("backward", only_under=("bookkeeping",)))
        self.patch(fairseq_trainer.Trainer, "train_step", self._train_step)
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._patches):
            setattr(owner, name, original)
        self._patches.clear()


def _ntokens(sample) -> int:
    return int(sample.get("ntokens", 0) or 0) if isinstance(sample, dict) else 0


def _nsentences(sample) -> int:
    if not isinstance(sample, dict):
        return 0
    target = sample.get("target")
    return int(target.shape[0]) if isinstance(target, torch.Tensor) else int(sample.get("nsentences", 0) or 0)


def profiler_activities(device):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def profile_summary(prof, device, top: int = 12) -> dict:
    """The profiled iteration: its top-level aten operators and the operators taking the most self time."""
    from count_bookkeeping_ops import top_level_aten_ops

    events = prof.events()
    averages = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    out = {"aten_ops": top_level_aten_ops(events),
           "top_self_cpu_ms": [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1000}
                               for e in averages[:top]]}
    if device.type == "cuda":
        gpu = sorted(prof.key_averages(), key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)
        out["top_self_gpu_ms"] = [{"op": e.key, "calls": e.count,
                                   "self_gpu_ms": getattr(e, "self_device_time_total", 0) / 1000}
                                  for e in gpu[:top]]
    return out


# -- the run ---------------------------------------------------------------------------------------
def run_training(argv: List[str]) -> None:
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    from fairseq_gradinit.fairseq_plugin.phase.lock import release_save_dirs

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    try:
        distributed_utils.call_main(cfg, train.main)
    finally:
        release_save_dirs()


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _update_stats(ups: List[dict], warmup: int) -> dict:
    """Medians over the training updates after the first ``warmup``: wall time from one update to the next."""
    for k, u in enumerate(ups):
        u["wall_s"] = ups[k + 1]["start"] - u["start"] if k + 1 < len(ups) else None
        u["cpu_s"] = ups[k + 1]["cpu_start"] - u["cpu_start"] if k + 1 < len(ups) else None
    timed = [u for u in ups[warmup:] if u["wall_s"] is not None and u["tokens"] > 0]
    return {
        "count": len(timed),
        "wall_s": _median([u["wall_s"] for u in timed]),
        "step_s": _median([u["step_s"] for u in timed]),
        "tokens": _median([u["tokens"] for u in timed]),
        "wall_s_per_token": _median([u["wall_s"] / u["tokens"] for u in timed]),
        "step_s_per_token": _median([u["step_s"] / u["tokens"] for u in timed]),
        "cpu_s_per_token": _median([u["cpu_s"] / u["tokens"] for u in timed]),
    }


def _kind_stats(rows: List[dict], kind: str, update: dict) -> Optional[dict]:
    """Medians over the timed iterations ``rows`` of one kind, and their ratios to ``update``."""
    if not rows:
        return None

    def med(key):
        return _median([e[key] for e in rows])

    def per_token(key, base):
        value = _median([e[key] / e["tokens"] for e in rows])
        return value / update[base] if update[base] else None

    return {
        "count": len(rows), "wall_s": med("wall_s"), "step_s": med("step_s"), "tokens_s": med("tokens_s"),
        "tokens_s_tilde": med("tokens_s_tilde") if kind == "objective" else None,
        "tokens_processed": med("tokens"), "wall_s_per_token": _median([e["wall_s"] / e["tokens"] for e in rows]),
        "per_token_ratio": per_token("wall_s", "wall_s_per_token"),
        "step_per_token_ratio": per_token("step_s", "step_s_per_token"),
        # the same in this thread's CPU time: what another program's load changes least
        "cpu_per_token_ratio": per_token("cpu_s", "cpu_s_per_token"),
        "per_update_ratio": med("wall_s") / update["wall_s"] if update["wall_s"] else None,
        "where": {"data": med("data_s"), "forward": med("forward_s"), "backward": med("backward_s"),
                  "bookkeeping": med("bookkeeping_s")},
    }


def summarize(probe: Probe, args) -> dict:
    its = probe.iterations
    # The wall time of iteration i: from drawing its pair to drawing the next one (the last one has none).
    for k, e in enumerate(its):
        start = e["pair_start"] if e["pair_start"] is not None else e["step_start"]
        cpu_start = e["pair_cpu_start"] if e["pair_cpu_start"] is not None else e["step_cpu_start"]
        nxt = its[k + 1] if k + 1 < len(its) else None
        e["wall_s"] = nxt["pair_start"] - start if nxt is not None else None
        e["cpu_s"] = nxt["pair_cpu_start"] - cpu_start if nxt is not None else None
        e["data_s"] = e["step_start"] - start
        e["tokens"] = e["tokens_s"] + e["tokens_s_tilde"] if e["kind"] == "objective" else e["tokens_s"]
    timed = [e for e in its[args.warmup:] if not e["profiled"] and e["wall_s"] is not None]
    update = _update_stats(probe.updates, args.warmup_updates)
    kinds = {kind: _kind_stats([e for e in timed if e["kind"] == kind], kind, update) for kind in KINDS}
    totals = dict(probe.clock.total)
    extra = sum(totals[k] for k in ("health", "snapshot", "fingerprint", "batch_plan", "result_write", "state_save",
                                    "logging"))
    # The profiled iterations (and the profiler) are not part of the phase as a run has it.
    profiled = sum(e["step_s"] + e["data_s"] for e in its if e["profiled"])
    phase = probe.phase_s - profiled if probe.phase_s is not None else None
    return {
        "kinds": kinds, "update": update, "sections_s": totals, "section_calls": dict(probe.clock.calls),
        "phase_s": phase, "phase_s_with_profiled": probe.phase_s, "profiled_s": profiled,
        "iterations": len(its) - sum(e["profiled"] for e in its),
        "iterations_wall_s": sum(e["wall_s"] for e in its if e["wall_s"] is not None and not e["profiled"]),
        "extra_s": extra, "extra_share": extra / phase if phase else None,
        "objective_per_token_ratio": (kinds["objective"] or {}).get("per_token_ratio"),
        "constraint_per_token_ratio": (kinds["constraint"] or {}).get("per_token_ratio"),
        "constraint_after_objective_per_token_ratio": (kinds["constraint_after_objective"] or {}).get("per_token_ratio"),
        "cpu_per_token_ratios": {k: (v or {}).get("cpu_per_token_ratio") for k, v in kinds.items()},
        "profiles": probe.profiles, "host_reads": probe.host_reads, "per_iteration": its, "per_update": probe.updates,
    }


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name()
    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def main(args):
    if args.tiny:
        apply_tiny(args)
    for name in ("objective_iters", "constraint_iters", "switch_iters", "updates", "warmup", "warmup_updates",
                 "profile_iters"):
        if getattr(args, name) < 0:
            usage_error(f"--{name.replace('_', '-')} {getattr(args, name)}: give a number >= 0")
    if args.updates <= args.warmup_updates:
        usage_error(f"--updates {args.updates}: give more than --warmup-updates ({args.warmup_updates})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        usage_error(f"--device {args.device}: CUDA is not available")
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    iters = len(schedule(args))
    if len(schedule(args, tail=False)) <= args.warmup:
        usage_error("the schedule has no timed iteration after --warmup: raise --objective-iters/--constraint-iters")
    data_bin = prepared_data_bin(args)
    with tempfile.TemporaryDirectory(prefix="phase-e2e-") as tmp:
        save_dir = Path(tmp) / "save"
        argv = train_argv(args, data_bin, save_dir, iters)
        start = time.perf_counter()
        with Probe(args, args.device) as probe:
            run_training(argv)
        total = time.perf_counter() - start
        result = json.loads((save_dir / "gradinit.json").read_text(encoding="utf-8"))
    summary = summarize(probe, args)
    tag = args.tag or f"phase_e2e_{args.device.split(':')[0]}{'_tiny' if args.tiny else ''}"
    report = {
        "device": device_name(args.device), "torch": torch.__version__, "tiny": bool(args.tiny),
        "settings": {k: getattr(args, k) for k in ("layers", "embed_dim", "ffn_dim", "heads", "max_tokens",
                                                   "objective_iters", "constraint_iters", "switch_iters",
                                                   "schedule", "warmup", "updates", "warmup_updates",
                                                   "profile_iters", "threads", "seed")},
        "data_bin": str(data_bin), "fairseq_train": ["fairseq-train"] + argv_for_report(argv),
        "total_s": total, "gradinit_json": {k: result.get(k) for k in ("iterations", "num_objective",
                                                                        "num_constraint", "max_tokens", "wall_time")},
        "targets": {"objective_per_token_ratio": 1.0, "constraint_per_token_ratio": 2.1, "extra_share": 0.05},
        **summary,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    md = markdown(report, tag)
    (out / f"{tag}.md").write_text(md, encoding="utf-8")
    print(md)  # noqa: T201
    return report


def argv_for_report(argv: List[str]) -> List[str]:
    """The command without this machine's temporary paths."""
    out = list(argv)
    out[0] = "DATA-BIN"
    out[out.index("--save-dir") + 1] = "SAVE-DIR"
    out[out.index("--user-dir") + 1] = "fairseq_gradinit"
    return out


def _tables():
    """scripts/benchmark_tables.py, which renders this benchmark's table for benchmarks/README.md too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_tables", REPO / "scripts" / "benchmark_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown(report: dict, tag: str) -> str:
    tables = _tables()
    st = report["settings"]
    head = (f"### {tag}: {st['layers']}+{st['layers']} layers, d={st['embed_dim']}, FFN {st['ffn_dim']}, "
            f"{st['heads']} heads, --max-tokens {st['max_tokens']}\n\n")
    prof = []
    for kind, p in report["profiles"].items():
        top = ", ".join(f"{e['op']} {e['self_cpu_ms']:.0f} ms" for e in p["top_self_cpu_ms"][:5])
        reads = report["host_reads"].get(kind, {}).get("total", "-")
        prof.append(f"- {tables.PHASE_E2E_LABELS[kind]}: {p['aten_ops']} top-level aten ops, {reads} host reads; "
                    f"most self CPU time: {top}")
    return head + tables.phase_e2e_markdown(report) + ("\nProfiled iterations (torch.profiler, not timed):\n" + "\n".join(prof) + "\n"
                                   if prof else "")


if __name__ == "__main__":
    main(get_args_parser().parse_args())
