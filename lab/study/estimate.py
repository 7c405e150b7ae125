"""How long a study call takes on one GPU (the d=512 setting) or on a 2-core CPU (the d=128 testbed),
estimated from measured throughput (pure Python; what ``python -m lab.study --dry-run`` and
``--list-presets`` print).

The figures (:data:`THROUGHPUT`) come from the stored evidence: ``transformer_iwslt_de_en`` (d=512),
4096-token batches, fp16, several processes sharing one GPU. Processes load the GPU unequally: a
GradInit phase (two forward/backward passes and a second-order gradient per iteration) weighs more
than a training arm. The model: each running process adds its weight to the GPU's *load* (an arm 1, a
phase :attr:`Throughput.phase_weight`); an arm's rate and a phase's duration are interpolated in the
load between measured points and, beyond the last point, the GPU's total rate stays constant. A job
spends :attr:`Throughput.startup_s` starting before it loads the GPU. Jobs start in the study's order
(phases first), at most ``parallel`` at once, an arm after its GradInit phase, as the scheduler runs them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple


#: The iterations of the measured GradInit phases (the paper's 780): :attr:`Throughput.phase_s` is per such phase.
MEASURED_PHASE_ITERS = 780


@dataclass(frozen=True)
class Throughput:
    """Measured throughput of the d=512 setting on one GPU: the numbers every estimate comes from."""

    name: str
    #: (GPU load, updates/s of each arm); load = arms + phase_weight * phases running at once.
    arm_rate: Tuple[Tuple[float, float], ...]
    #: (GPU load, seconds of one 780-iteration GradInit phase at that load).
    phase_s: Tuple[Tuple[float, float], ...]
    phase_weight: float
    startup_s: float = 20.0                   # process start to its first update (imports, data, model, CUDA)
    overhead_s: float = 15.0                  # the study's own start (parsing every arm) and packing
    fp32_factor: float = 1.0                  # fp32 arm rate / fp16 arm rate
    source: str = ""
    #: How ``describe`` names the machine (default: the name, upper case: "one H200").
    label: str = ""
    #: Figures of a CPU (the runs use ``--cpu``), not of a GPU.
    cpu: bool = False

    @property
    def machine(self) -> str:
        return self.label or self.name.upper()


#: One H200: two arms alone 13-15 updates/s each (13 used); five training processes ~8 each; two arms
#: beside three GradInit phases 6.2-7.9 each (7 used), so a phase weighs (40/7 - 2)/3 = 1.24 arms; one
#: phase alone 161 s, three phases beside two arms 299 s. fp32: on one H100, two fp32 arms beside three
#: other processes ran 5.8 updates/s against 3.3-5.7 for fp16 arms (factor 1 used).
H200 = Throughput(
    name="h200",
    arm_rate=((2.0, 13.0), (5.0, 8.0)),
    phase_s=((1.24, 161.0), (5.72, 299.0)),
    phase_weight=1.24,
    source="lab/record/evidence/nowarmup-d512-hold-2026-11-27 (one H200) and nowarmup-d512-authors-2026-11-26 "
           "(one H100, fp32)",
)
#: One H100: three fp32 arms at once >= 6.5 updates/s each (1118-1143 updates in 174 s with start-up); five
#: processes (arms beside phases) 3.3-5.7 (4.5 used); a phase beside four other processes 262-291 s (291 used
#: at every load up to that: no H100 figure with fewer processes).
H100 = Throughput(
    name="h100",
    arm_rate=((3.0, 6.5), (5.0, 4.5)),
    phase_s=((5.72, 291.0),),
    phase_weight=1.24,
    source="lab/record/evidence/nowarmup-d512-authors-2026-11-26 (one H100)",
)
#: A 2-core CPU, one thread per process, the d=128 testbed (preset ``testbed``): an arm's updates per second with
#: two arms at once on the idle machine (validation in both modes and the monitor included, start-up apart) and a
#: phase's seconds, as measured in lab/record/testbed-d128.md ("the 8-arm budget" and batch 1).
#: Beyond two processes the machine's total rate stays what it was at two.
CPU2 = Throughput(
    name="cpu2",
    label="2-core CPU (one thread per process)",
    arm_rate=((2.0, 0.93),),
    phase_s=((2.0, 2300.0),),
    phase_weight=1.0,
    startup_s=15.0,
    overhead_s=10.0,
    source="lab/record/testbed-d128.md (one 2-core machine, two processes at once)",
    cpu=True,
)
THROUGHPUT: Dict[str, Throughput] = {t.name: t for t in (H200, H100, CPU2)}
#: The GPUs whose figures ``--gpu`` may name.
GPU_THROUGHPUT = tuple(sorted(name for name, t in THROUGHPUT.items() if not t.cpu))


def _interp(points: Sequence[Tuple[float, float]], x: float) -> float:
    """Piecewise linear through ``points``; flat below the first point."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def arm_rate(tp: Throughput, load: float) -> float:
    """Updates/s of one fp16 arm when the GPU carries ``load``."""
    last_load, last_rate = tp.arm_rate[-1]
    if load > last_load:  # the GPU's total rate stays what it was at the last measured load
        return last_rate * last_load / load
    return _interp(tp.arm_rate, load)


def phase_seconds(tp: Throughput, load: float) -> float:
    """Duration of a 780-iteration GradInit phase run entirely at ``load``."""
    last_load, last_s = tp.phase_s[-1]
    if load > last_load:
        return last_s * load / last_load
    return _interp(tp.phase_s, load)


#: What each simulated Adam step beyond the first adds to a phase, as a fraction of a one-step phase of the same
#: iterations (--gradinit-lookahead-steps; one forward/backward pass on S per objective iteration and step).
#: From the 2-core CPU's measurement (lab/record/testbed-d128.md, batch 2's phase time); a ratio of passes, used
#: for the GPUs' figures too.
LOOKAHEAD_STEP_COST = 0.18


def lookahead_factor(steps: int) -> float:
    """How much longer a phase with ``steps`` simulated Adam steps takes than one with the paper's single step."""
    return 1.0 + LOOKAHEAD_STEP_COST * (max(int(steps), 1) - 1)


@dataclass
class EstJob:
    """One job of the estimate: an arm (``updates`` to train) or a GradInit phase (``iters``)."""

    name: str
    kind: str                                 # "arm" or "phase"
    updates: int = 0
    iters: int = MEASURED_PHASE_ITERS
    lookahead: int = 1                        # --gradinit-lookahead-steps of a phase
    fp32: bool = False
    deps: Tuple[str, ...] = ()
    start_s: Optional[float] = None
    end_s: Optional[float] = None
    done: float = 0.0                         # updates trained, or the fraction of the phase done
    stopped_by_budget: bool = False


@dataclass
class CallEstimate:
    """An estimated call: every job's start/end and what the whole call takes."""

    throughput: Throughput
    jobs: List[EstJob]
    training_s: float                         # study start to the end of the last arm or phase
    bleu_s: float
    total_s: float
    upper_bound_s: Optional[float] = None     # overhead + --time-budget + BLEU budget
    limit_s: Optional[float] = None
    notes: List[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        arms_done = all(not j.stopped_by_budget for j in self.jobs)
        within = self.limit_s is None or (self.total_s <= self.limit_s and
                                          (self.upper_bound_s is None or self.upper_bound_s <= self.limit_s))
        return arms_done and within

    def describe(self) -> str:
        tp = self.throughput
        lines = [f"estimate on one {tp.machine} (figures: {tp.source}):"]
        for j in self.jobs:
            if j.start_s is None:
                lines.append(f"  {j.kind} {j.name}: does not start within the time budget")
                continue
            steps = f", {j.lookahead} simulated steps" if j.kind == "phase" and j.lookahead > 1 else ""
            what = (f"{int(j.done)}/{j.updates} updates" if j.kind == "arm" else f"{j.iters} GradInit iterations{steps}")
            if j.stopped_by_budget:
                what = ("stopped by the time budget at " + what if j.kind == "arm"
                        else f"killed by the time budget at {j.done:.0%} of {j.iters} GradInit iterations")
            lines.append(f"  {j.kind} {j.name}: starts {j.start_s:.0f} s, ends {j.end_s:.0f} s "
                         f"({j.end_s - j.start_s:.0f} s, {what})")
        lines.append(f"  GradInit phases and training {self.training_s:.0f} s, BLEU {self.bleu_s:.0f} s, "
                     f"study start and packing {tp.overhead_s:.0f} s: call {self.total_s:.0f} s")
        if self.upper_bound_s is not None:
            lines.append(f"  at most {self.upper_bound_s:.0f} s (the time budget and BLEU budget spent in full)")
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.limit_s is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(f"  budget check: {verdict} the call's limit of {self.limit_s:.0f} s")
        return "\n".join(lines)


def estimate_call(jobs: Sequence[EstJob], *, throughput: Throughput, parallel: int,
                  time_budget_s: Optional[float] = None, finish_margin_s: float = 30.0,
                  bleu_s: float = 0.0, bleu_budget_s: Optional[float] = None,
                  limit_s: Optional[float] = None, step_s: float = 0.5) -> CallEstimate:
    """Simulate the scheduler on the throughput model (steps of ``step_s`` seconds).

    ``bleu_s`` is what the BLEU step is expected to take (its budget where one is set: no decode rate
    is documented yet). An arm's ``--stop-time-hours`` is what is left of the budget less
    ``finish_margin_s`` at its launch, and fairseq counts it from the end of start-up: the arm stops at
    ``time_budget_s - finish_margin_s + startup_s``, and at ``time_budget_s`` the study kills it.
    """
    tp = throughput
    jobs = [EstJob(**{k: getattr(j, k) for k in ("name", "kind", "updates", "iters", "lookahead", "fp32", "deps")})
            for j in jobs]
    by_name = {j.name: j for j in jobs}
    start_until = None if time_budget_s is None else time_budget_s - finish_margin_s
    stop_at = None if time_budget_s is None else min(time_budget_s, start_until + tp.startup_s)
    t, running = 0.0, []
    pending = list(jobs)
    horizon = 24 * 3600.0
    while (pending or running) and t < horizon:
        for j in list(pending):
            if len(running) >= parallel:
                break
            if any(by_name[d].end_s is None for d in j.deps if d in by_name):
                continue
            if start_until is not None and t >= start_until:
                break
            j.start_s = t
            running.append(j)
            pending.remove(j)
        load = sum((1.0 if j.kind == "arm" else tp.phase_weight) for j in running
                   if t - j.start_s >= tp.startup_s)
        for j in list(running):
            if t - j.start_s < tp.startup_s:
                continue
            if j.kind == "arm":
                j.done += step_s * arm_rate(tp, load) * (tp.fp32_factor if j.fp32 else 1.0)
                finished = j.done >= j.updates
                if not finished and stop_at is not None and t + step_s >= stop_at:
                    j.stopped_by_budget = True
                    finished = True
            else:
                j.done += step_s / (phase_seconds(tp, load) * j.iters / MEASURED_PHASE_ITERS * lookahead_factor(j.lookahead))
                finished = j.done >= 1.0
            if finished:
                j.done = min(j.done, j.updates) if j.kind == "arm" else 1.0
                j.end_s = t + step_s
                running.remove(j)
        t += step_s
        if time_budget_s is not None and t >= time_budget_s:  # the study kills what still runs
            for j in running:
                j.end_s, j.stopped_by_budget = t, True
            break
    for j in pending:  # never started: the budget ended first
        j.stopped_by_budget = True
    ended = [j.end_s for j in jobs if j.end_s is not None]
    training_s = max(ended) if ended else 0.0
    total = tp.overhead_s + training_s + bleu_s
    upper = None
    if time_budget_s is not None:
        upper = tp.overhead_s + time_budget_s + (bleu_budget_s if bleu_budget_s is not None else bleu_s)
    notes = []
    if any(j.fp32 for j in jobs) and not tp.cpu:
        notes.append(f"fp32 arms at {tp.fp32_factor:g} x the fp16 rate")
    return CallEstimate(throughput=tp, jobs=jobs, training_s=training_s, bleu_s=bleu_s, total_s=total,
                        upper_bound_s=upper, limit_s=limit_s, notes=notes)


# ------------------------------------------------------------------------------------------------
# from a study's plan, or from a preset's call
# ------------------------------------------------------------------------------------------------
def _int_option(argv: Sequence[str], option: str, default: int) -> int:
    """An integer option of a command line as fairseq's parser reads it (``--opt N``, ``--opt=N``), else ``default``."""
    from .arms import option_value

    value = option_value(argv, option)
    try:
        return default if value is None else int(float(value))
    except ValueError:
        return default


def _iters(argv: Sequence[str]) -> int:
    """The phase's ``--gradinit-iters``, else the plugin's declared default."""
    from fairseq_gradinit.fairseq_plugin.settings.options import GradInitOptions

    return _int_option(argv, "--gradinit-iters", GradInitOptions.__dataclass_fields__["gradinit_iters"].default)


def _simulated_steps(argv: Sequence[str]) -> int:
    """The phase's simulated steps: the flag, else the plugin's default for the command (several with Adam
    unless --gradinit-unstepped-uses pins the paper's single step; one with SGD)."""
    from fairseq_gradinit.fairseq_plugin.settings.options import default_lookahead_steps

    from .arms import has_option, option_value

    if option_value(argv, "--gradinit-lookahead-steps") is not None:
        return _int_option(argv, "--gradinit-lookahead-steps", 1)
    # GradInit's own optimizer overrides the training's
    optimizer = option_value(argv, "--gradinit-optimizer") or option_value(argv, "--optimizer") or "adam"
    unstepped = True if has_option(argv, "--gradinit-unstepped-uses") else None
    return default_lookahead_steps(adam=optimizer not in ("sgd", "nag"), unstepped_uses=unstepped)


def _is_fp32(argv: Sequence[str]) -> bool:
    from .arms import has_option

    return not any(has_option(argv, flag) for flag in ("--fp16", "--bf16", "--amp"))


def plan_jobs(plans, groups, *, max_update: int) -> List[EstJob]:
    """The jobs of a planned study (:func:`~.plan.plan_study`): uncached GradInit groups first, then arms."""
    jobs = [EstJob(f"gi-{key}", "phase", iters=_iters(g.phase_argv),
                   lookahead=_simulated_steps(g.phase_argv))
            for key, g in groups.items() if not g.cached]
    phases = {j.name for j in jobs}
    for p in plans:
        if not p.train:
            continue
        dep = f"gi-{p.group}" if p.group is not None else None
        jobs.append(EstJob(p.arm.name, "arm", updates=_int_option(p.argv, "--max-update", max_update),
                           fp32=_is_fp32(p.argv), deps=(dep,) if dep in phases else ()))
    return jobs


def call_jobs(arms: Sequence, train: Sequence[str], prepare: Sequence[str], base: Sequence[str], *,
              max_update: int, cached: Sequence[str] = ()) -> List[EstJob]:
    """The jobs of a preset's call without planning it: one phase per arm that computes scales and is
    not in ``cached`` (arms that share a GradInit group share one phase in the real plan, so this can
    only overestimate)."""
    from .arms import has_option, merge_args

    by_name = {a.name: a for a in arms}
    jobs, arm_jobs = [], []
    for name in list(train) + list(prepare):
        arm = by_name[name]
        argv = merge_args(base, arm.args, arm.drop)
        computes = (has_option(argv, "--gradinit-iters") and not has_option(argv, "--gradinit-init-file")
                    and name not in cached)
        if computes:
            jobs.append(EstJob(f"gi-{name}", "phase", iters=_iters(argv),
                               lookahead=_simulated_steps(argv)))
        if name in train:
            arm_jobs.append(EstJob(name, "arm", updates=_int_option(argv, "--max-update", max_update),
                                   fp32=_is_fp32(argv), deps=(f"gi-{name}",) if computes else ()))
    return jobs + arm_jobs
