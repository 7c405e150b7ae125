"""Study runner: named arms of ``fairseq-train`` on one data-bin, one GPU (or the CPU), one budget.

An *arm* is a name plus ``fairseq-train`` arguments on top of a common base (a preset's, or
``--base-args``). :func:`run_study`

1. validates every arm's arguments with fairseq's own parser before anything runs;
2. groups the GradInit arms by what determines their scales
   (:func:`~fairseq_gradinit.fairseq_plugin.provenance.fingerprint_from_args`: model arguments,
   criterion, seed, data, world size, GradInit settings) and computes each group's scales once, in a
   *GradInit phase* (:func:`gradinit_phase_main`: the task, model and criterion built exactly as
   ``fairseq-train`` builds them, no training), into a cache folder that later studies reuse while
   the fingerprint matches; every arm of the group then starts from those scales through
   ``--gradinit-init-file`` (training from re-applied scales with the same seed reproduces a run
   that computed them);
3. runs the phases and the arms as subprocesses, up to ``parallel`` at once (several small models
   share one GPU; on the CPU use 1), each arm with ``--stop-time-hours`` set from what is left of the
   wall-time budget, and kills whatever still runs when the budget is spent;
4. writes ``curves.csv`` (per arm and logged update: eval-mode validation loss, training loss, fp16
   loss scale, lr, gradient norm, from fairseq's log), ``curves.png``, ``curves.md`` and
   ``study.json``, and BLEU (``scripts/evaluate_bleu.py``: beam 5, detokenized, sacreBLEU) of every
   arm at the largest checkpoint update that all arms reached, in the same run, so checkpoints never
   have to leave the machine.

The command line is ``scripts/study.py`` (:func:`main`); presets are in :mod:`.study_presets`.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import curves as curve_logs
from .init_file import compute_only_flags

logger = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # fairseq-train --user-dir
REPO_ROOT = PACKAGE_DIR.parent
DEFAULT_BLEU_SCRIPT = REPO_ROOT / "scripts" / "evaluate_bleu.py"

#: Options the runner sets itself for every arm.
BLEU_LENGTH_LIMITS = ("--max-len-a", "1.2", "--max-len-b", "10")  # fairseq-generate, as the authors decode
RESERVED_OPTIONS = ("--save-dir", "--stop-time-hours", "--user-dir")
_ARM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_]\w*)\}")
_CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)_(\d+)\.pt$")
_STOP_TIME_MSG = "Stopping training due to cumulative_training_time"


# ------------------------------------------------------------------------------------------------
# arms and their arguments
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """One training run: ``args`` are added to the base, ``drop`` removes base options (a flag
    cannot be negated on fairseq's command line), ``data`` names the data-bin (``main`` or a key of
    ``--data-bin KEY=PATH``)."""

    name: str
    args: Tuple[str, ...] = ()
    drop: Tuple[str, ...] = ()
    data: str = "main"
    note: str = ""

    def __post_init__(self):
        if not _ARM_NAME_RE.match(self.name):
            raise ValueError(f"arm name {self.name!r}: use letters, digits, '.', '_' and '-' "
                             "(it names the arm's folder)")
        for opt in self.drop:
            if not opt.startswith("--"):
                raise ValueError(f"arm {self.name}: dropped option {opt!r} must start with '--'")

    def spec(self) -> str:
        """The arm as ``NAME[@DATA]=ARGS`` (what :func:`parse_arm_spec` reads)."""
        head = self.name if self.data == "main" else f"{self.name}@{self.data}"
        return head + "=" + shlex.join([f"!{d}" for d in self.drop] + list(self.args))


def parse_arm_spec(spec: str, *, note: str = "") -> Arm:
    """``NAME[@DATA]=ARGS`` -> :class:`Arm`. In ARGS, ``!--flag`` drops ``--flag`` (and its
    values) from the base, e.g. ``sep@separate=!--share-all-embeddings --share-decoder-input-output-embed``."""
    head, sep, rest = spec.partition("=")
    if not sep or not head.strip():
        raise ValueError(f"arm {spec!r}: expected NAME[@DATA]=ARGS, e.g. x999='--adam-betas \"(0.9, 0.999)\"'")
    name, _, data = head.strip().partition("@")
    try:
        tokens = shlex.split(rest)
    except ValueError as e:
        raise ValueError(f"arm {name}: cannot split its arguments ({e}): {rest!r}") from None
    drop = tuple(t[1:] for t in tokens if t.startswith("!"))
    args = tuple(t for t in tokens if not t.startswith("!"))
    return Arm(name=name, args=args, drop=drop, data=data or "main", note=note)


def read_arms_file(path: Path) -> List[Arm]:
    """Arms from a text file: one ``NAME[@DATA]=ARGS`` per line; ``#`` starts a comment line, a
    line ending in ``\\`` continues on the next."""
    arms, pending = [], ""
    for lineno, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text, pending = pending + line, ""
        try:
            arms.append(parse_arm_spec(text))
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
    if pending:
        raise ValueError(f"{path}: the last line ends in '\\' with nothing after it")
    return arms


def option_groups(argv: Sequence[str]) -> List[List[str]]:
    """Split a command line into ``[option, value, ...]`` groups (a leading positional group too).
    Values never start with ``--`` in fairseq's options (negative numbers start with a single ``-``)."""
    groups: List[List[str]] = []
    for token in argv:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def _option_name(token: str) -> Optional[str]:
    return token.split("=", 1)[0] if token.startswith("--") else None


def merge_args(base: Sequence[str], args: Sequence[str], drop: Sequence[str] = ()) -> List[str]:
    """``base`` without the options that ``args`` sets again or ``drop`` names, then ``args``."""
    override = {_option_name(g[0]) for g in option_groups(args)} | set(drop)
    kept = [g for g in option_groups(base) if _option_name(g[0]) not in override]
    return [t for g in kept for t in g] + list(args)


def has_option(argv: Sequence[str], name: str) -> bool:
    return any(_option_name(t) == name for t in argv)


def substitute_files(argv: Sequence[str], files: Mapping[str, str], *, arm: str) -> List[str]:
    """Replace ``{KEY}`` in the arguments with ``files[KEY]`` (``--file KEY=PATH``)."""
    def one(token: str) -> str:
        def repl(m):
            key = m.group(1)
            if key not in files:
                known = ", ".join(sorted(files)) or "none"
                raise ValueError(f"arm {arm}: {{{key}}} is not a known file (known: {known}); "
                                 f"pass --file {key}=PATH")
            return str(files[key])
        return _PLACEHOLDER_RE.sub(repl, token)
    return [one(t) for t in argv]


# ------------------------------------------------------------------------------------------------
# configuration and plan
# ------------------------------------------------------------------------------------------------
@dataclass
class StudyConfig:
    """Everything a study run needs (what :func:`main` builds from its command line)."""

    data: Dict[str, str]                      # "main" -> data-bin, plus --data-bin KEY=PATH
    out: Path
    arms: Tuple[Arm, ...]                     # the arms trained in this run
    base: Tuple[str, ...] = ()                # fairseq-train arguments common to all arms
    prepare: Tuple[Arm, ...] = ()             # arms whose GradInit scales are cached, not trained
    files: Dict[str, str] = field(default_factory=dict)  # {KEY} placeholders in arm arguments
    parallel: int = 1
    time_budget_s: Optional[float] = None     # wall time of the GradInit phases and training
    finish_margin_s: float = 30.0             # left to each arm after its --stop-time-hours
    max_update: int = 3000
    valid_every: int = 100                    # validation and train_inner logging interval
    save_every: int = 500                     # checkpoint interval (candidates for BLEU)
    cpu: bool = False
    bleu: bool = True
    bleu_ref: Optional[str] = None            # raw reference file (else the T- lines)
    bleu_subset: str = "test"
    bleu_args: Tuple[str, ...] = ()           # passed to fairseq-generate
    bleu_budget_s: Optional[float] = None
    bleu_script: Path = DEFAULT_BLEU_SCRIPT
    gradinit_cache: Optional[Path] = None     # default OUT/gradinit
    python: str = sys.executable

    def __post_init__(self):
        names = [a.name for a in self.arms] + [a.name for a in self.prepare]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"arm names must be unique (and an arm is either trained or prepared): {dupes}")
        if not self.arms and not self.prepare:
            raise ValueError("no arms: pass --preset NAME, --arm NAME=ARGS or --arms-file FILE")
        if self.parallel < 1:
            raise ValueError(f"--parallel must be >= 1, got {self.parallel}")
        for opt in RESERVED_OPTIONS:
            if has_option(self.base, opt):
                raise ValueError(f"the base arguments set {opt}: the study sets it for every arm; remove it")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError("--time-budget must be positive")

    @property
    def cache_dir(self) -> Path:
        return Path(self.gradinit_cache) if self.gradinit_cache else Path(self.out) / "gradinit"


@dataclass
class GradInitGroup:
    """Arms whose GradInit scales are the same computation."""

    key: str
    fingerprint: dict
    arms: List[str]
    phase_argv: List[str]                     # fairseq-train arguments of the phase (no --save-dir)
    dir: Path
    cached: bool = False

    @property
    def scales_file(self) -> Path:
        return self.dir / "gradinit.json"


@dataclass
class ArmPlan:
    arm: Arm
    argv: List[str]                           # fairseq-train arguments, data first, no save-dir/stop-time
    data: str
    save_dir: Path
    group: Optional[str] = None               # GradInitGroup.key when the arm's scales are shared
    train: bool = True                        # False: only its GradInit group is prepared


def study_defaults(cfg: StudyConfig) -> List[str]:
    """fairseq-train arguments every arm starts from (an arm or the base may override them)."""
    v, s = str(cfg.valid_every), str(cfg.save_every)
    return ["--task", "translation_gradinit", "--max-update", str(cfg.max_update),
            "--validate-interval-updates", v, "--validate-interval", "1000000", "--log-interval", v,
            "--log-format", "simple", "--no-progress-bar",
            # checkpoints only every save_every updates (and at the end), without optimizer state
            # (they are only evaluated), so BLEU can pick a common update
            "--save-interval", "1000000", "--save-interval-updates", s, "--no-epoch-checkpoints",
            "--no-save-optimizer-state"]


def _parse_fairseq_args(argv: Sequence[str], *, arm: str):
    """fairseq's own parse of a fairseq-train command line (the plugin is imported already)."""
    from fairseq import options

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return options.parse_args_and_arch(options.get_training_parser(), input_args=list(argv))
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        raise ValueError(f"arm {arm}: fairseq-train rejects its arguments: {msg[-1] if msg else 'bad arguments'}")


def group_key(fp: Mapping) -> str:
    from .provenance import COMPARED_KEYS

    compared = {k: fp.get(k) for k in COMPARED_KEYS}
    return hashlib.sha256(json.dumps(compared, sort_keys=True, default=str).encode()).hexdigest()[:12]


def cached_scales_match(group_dir: Path, fp: Mapping) -> bool:
    """Whether ``group_dir`` holds scales computed for fingerprint ``fp`` (the sidecar
    ``fingerprint.json``, and the one inside ``gradinit.json`` where the task records it)."""
    from .provenance import fingerprint_diff

    scales, side = group_dir / "gradinit.json", group_dir / "fingerprint.json"
    if not scales.is_file() or not side.is_file():
        return False
    try:
        saved = json.loads(side.read_text())
        inner = json.loads(scales.read_text()).get("fingerprint")
    except (OSError, json.JSONDecodeError):
        return False
    if fingerprint_diff(saved, fp):
        return False
    return inner is None or not fingerprint_diff(inner, fp)


def plan_study(cfg: StudyConfig) -> Tuple[List[ArmPlan], Dict[str, GradInitGroup]]:
    """Each arm's fairseq-train arguments (validated by fairseq's parser) and the GradInit groups."""
    from .provenance import fingerprint_from_args

    base = merge_args(study_defaults(cfg), list(cfg.base))
    if cfg.cpu and not has_option(base, "--cpu"):
        base.append("--cpu")
    plans: List[ArmPlan] = []
    groups: Dict[str, GradInitGroup] = {}
    for arm, train in [(a, True) for a in cfg.arms] + [(a, False) for a in cfg.prepare]:
        for opt in RESERVED_OPTIONS:
            if has_option(arm.args, opt):
                raise ValueError(f"arm {arm.name} sets {opt}: the study sets it for every arm; remove it")
        if arm.data not in cfg.data:
            known = ", ".join(sorted(cfg.data))
            raise ValueError(f"arm {arm.name} trains on data-bin {arm.data!r}, which was not given "
                             f"(known: {known}); pass --data-bin {arm.data}=PATH or leave the arm out")
        data = str(cfg.data[arm.data])
        if not Path(data).is_dir():
            raise ValueError(f"arm {arm.name}: data-bin {data} is not a directory")
        argv = [data] + substitute_files(merge_args(base, arm.args, arm.drop), cfg.files, arm=arm.name)
        ns = _parse_fairseq_args(argv, arm=arm.name)
        plan = ArmPlan(arm=arm, argv=argv, data=data, save_dir=Path(cfg.out) / "arms" / arm.name, train=train)
        if getattr(ns, "gradinit_iters", 0) > 0 and not getattr(ns, "gradinit_init_file", None):
            if int(getattr(ns, "distributed_world_size", 1) or 1) > 1:
                raise ValueError(f"arm {arm.name}: the study runs one process per arm; "
                                 "--distributed-world-size must be 1")
            fp = fingerprint_from_args(argv)
            key = group_key(fp)
            if key not in groups:
                gdir = cfg.cache_dir / f"gi-{key}"
                groups[key] = GradInitGroup(key=key, fingerprint=fp, arms=[], phase_argv=list(argv), dir=gdir,
                                            cached=cached_scales_match(gdir, fp))
            groups[key].arms.append(arm.name)
            plan.group = key
        elif not train:
            raise ValueError(f"arm {arm.name} is to be prepared but computes no GradInit scales "
                             "(no --gradinit-iters, or it reads --gradinit-init-file)")
        plans.append(plan)
    return plans, groups


def arm_command(cfg: StudyConfig, plan: ArmPlan, groups: Mapping[str, GradInitGroup]) -> List[str]:
    argv = list(plan.argv)
    if plan.group is not None:
        # The group's phase computed the scales with these settings; the arm only applies them.
        argv = merge_args(argv, ["--gradinit-init-file", str(groups[plan.group].scales_file)],
                          drop=compute_only_flags())
    return [cfg.python, "-m", "fairseq_cli.train", *argv, "--user-dir", str(PACKAGE_DIR),
            "--save-dir", str(plan.save_dir)]


def phase_command(cfg: StudyConfig, group: GradInitGroup, save_dir: Path) -> List[str]:
    return [cfg.python, "-m", "fairseq_gradinit.fairseq_plugin.study", "gradinit-phase",
            *group.phase_argv, "--save-dir", str(save_dir)]


# ------------------------------------------------------------------------------------------------
# the GradInit phase: scales only, built as fairseq-train builds them
# ------------------------------------------------------------------------------------------------
def gradinit_phase_main(argv: Sequence[str]) -> int:
    """Compute GradInit scales for a fairseq-train command line and write ``SAVE_DIR/gradinit.json``.

    Mirrors ``fairseq_cli.train.main`` up to ``task.build_criterion`` (where the task runs
    GradInit): the same config, seeds, task, model and criterion, hence the same initial weights,
    batches and scales. Nothing is trained and no checkpoint is written.
    """
    import numpy as np
    from fairseq import tasks, utils
    from fairseq.dataclass.initialize import add_defaults
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from . import task as _task  # noqa: F401  (registers translation_gradinit)

    args = _parse_fairseq_args(argv, arm="gradinit-phase")
    cfg = convert_namespace_to_omegaconf(args)
    add_defaults(cfg)
    if int(cfg.distributed_training.distributed_world_size) > 1:
        raise ValueError("the GradInit phase runs in one process: --distributed-world-size must be 1")
    if not cfg.task.gradinit_iters or cfg.task.gradinit_init_file:
        raise ValueError("the GradInit phase needs --gradinit-iters N > 0 and no --gradinit-init-file")
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    task.build_model(cfg.model)
    task.build_criterion(cfg.criterion)  # runs GradInit and writes save_dir/gradinit.json
    out = Path(cfg.checkpoint.save_dir) / "gradinit.json"
    if not out.is_file():
        raise RuntimeError(f"GradInit ran but {out} was not written")
    return 0


# ------------------------------------------------------------------------------------------------
# running subprocesses within a budget
# ------------------------------------------------------------------------------------------------
@dataclass
class Job:
    name: str
    kind: str                                 # "phase", "arm" or "bleu"
    cmd: List[str]
    log: Path
    deps: Tuple[str, ...] = ()
    stop_time: bool = False                   # append --stop-time-hours from the budget at launch
    on_success: Optional[Callable[["Job"], None]] = None
    status: str = "pending"                   # pending/running/done/failed/killed/skipped
    reason: str = ""
    returncode: Optional[int] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    stop_time_hours: Optional[float] = None
    proc: Optional[subprocess.Popen] = field(default=None, repr=False)

    def summary(self, t0: float) -> dict:
        return {"status": self.status, "reason": self.reason, "returncode": self.returncode,
                "start_s": None if self.started is None else round(self.started - t0, 1),
                "wall_s": None if self.started is None or self.ended is None else round(self.ended - self.started, 1),
                "stop_time_hours": self.stop_time_hours, "log": str(self.log)}


def _kill(job: Job, grace_s: float = 10.0) -> None:
    """SIGTERM to the job's process group (it was started in its own session), SIGKILL after a grace."""
    proc = job.proc
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def run_jobs(jobs: Sequence[Job], *, parallel: int, deadline: Optional[float] = None,
             finish_margin_s: float = 0.0, env: Optional[Mapping[str, str]] = None,
             poll_s: float = 0.5, cwd: Optional[Path] = None) -> None:
    """Run ``jobs`` (in list order, at most ``parallel`` at once, each after its ``deps`` succeeded)
    until all ended or ``deadline`` (``time.time()`` seconds) passed; then the running ones are
    killed and the pending ones skipped. Statuses are written into the jobs."""
    by_name = {j.name: j for j in jobs}
    running: List[Job] = []
    try:
        while True:
            for job in list(running):
                rc = job.proc.poll()
                if rc is None:
                    continue
                running.remove(job)
                job.ended, job.returncode = time.time(), rc
                job.status = "done" if rc == 0 else "failed"
                if rc != 0:
                    job.reason = f"exit code {rc} (see {job.log})"
                elif job.on_success is not None:
                    try:
                        job.on_success(job)
                    except Exception as e:  # a phase that wrote no scales: its arms cannot start
                        job.status, job.reason = "failed", str(e)
            now = time.time()
            if deadline is not None and now >= deadline:
                for job in running:
                    _kill(job)
                    job.ended, job.returncode = time.time(), job.proc.returncode
                    job.status, job.reason = "killed", "still running when the time budget was spent"
                running.clear()
                for job in jobs:
                    if job.status == "pending":
                        job.status, job.reason = "skipped", "the time budget was spent before it could start"
                return
            for job in jobs:
                if job.status != "pending":
                    continue
                dep_status = [by_name[d].status for d in job.deps]
                if any(s in ("failed", "killed", "skipped") for s in dep_status):
                    bad = [d for d in job.deps if by_name[d].status in ("failed", "killed", "skipped")]
                    job.status, job.reason = "skipped", f"{', '.join(bad)} did not succeed"
                    continue
                if len(running) >= parallel or any(s != "done" for s in dep_status):
                    continue
                cmd = list(job.cmd)
                if job.stop_time and deadline is not None:
                    left = deadline - now - finish_margin_s
                    if left <= 0:
                        job.status, job.reason = "skipped", "too little of the time budget left to start"
                        continue
                    job.stop_time_hours = round(left / 3600.0, 6)
                    cmd += ["--stop-time-hours", f"{job.stop_time_hours:.6f}"]
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with open(job.log, "w", encoding="utf-8") as log:
                    log.write("# " + shlex.join(cmd) + "\n")
                    log.flush()
                    job.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env or os.environ),
                                                cwd=str(cwd) if cwd else None, start_new_session=True)
                job.started, job.status = time.time(), "running"
                running.append(job)
                logger.info("study: started %s %s (log %s)", job.kind, job.name, job.log)
            if not running and all(j.status != "pending" for j in jobs):
                return
            time.sleep(poll_s)
    except BaseException:
        for job in running:  # interrupted: leave nothing behind
            _kill(job, grace_s=2.0)
            job.status, job.reason = "killed", "the study was interrupted"
        raise


def subprocess_env(cfg: StudyConfig) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cfg.cpu and "OMP_NUM_THREADS" not in env:
        # arms at once on the CPU share its cores instead of each taking all of them
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.parallel))
    return env


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------
CSV_FIELDS = ("arm", "num_updates", "valid_loss", "valid_nll_loss", "train_loss", "train_nll_loss",
              "loss_scale", "lr", "gnorm", "wall_s")


def arm_curves(log: Path) -> Dict[str, curve_logs.Curve]:
    if not log.is_file():
        return {}
    with open(log, encoding="utf-8", errors="replace") as f:
        return curve_logs.parse_training_log(f)


def curve_rows(name: str, curves: Mapping[str, curve_logs.Curve]) -> List[dict]:
    """One CSV row per logged update of one arm (validation and train_inner lines merged)."""
    columns = {"valid_loss": "valid_loss", "valid_nll_loss": "valid_nll_loss", "train_loss": "train_loss",
               "train_nll_loss": "train_nll_loss", "loss_scale": "train_loss_scale", "lr": "train_lr",
               "gnorm": "train_gnorm", "wall_s": "train_wall"}
    updates = sorted({u for c in curves.values() for u in c})
    return [{"arm": name, "num_updates": u, **{col: curves.get(key, {}).get(u, "") for col, key in columns.items()}}
            for u in updates]


def write_curves(out: Path, all_curves: Mapping[str, Mapping[str, curve_logs.Curve]]) -> Dict[str, str]:
    """``curves.csv``, ``curves.md`` (validation loss table) and ``curves.png`` (three panels)."""
    written = {}
    csv_path = out / "curves.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for name, curves in all_curves.items():
            w.writerows(curve_rows(name, curves))
    written["csv"] = str(csv_path)
    valid = {n: c.get("valid_loss", {}) for n, c in all_curves.items()}
    md = out / "curves.md"
    md.write_text(curve_logs.markdown_table(valid, "loss (eval mode)", "valid"), encoding="utf-8")
    written["md"] = str(md)
    png = out / "curves.png"
    panels = [("valid loss (eval mode)", valid, False),
              ("train loss (dropout on)", {n: c.get("train_loss", {}) for n, c in all_curves.items()}, False),
              ("fp16 loss scale", {n: c.get("train_loss_scale", {}) for n, c in all_curves.items()}, True)]
    if curve_logs.plot_panels(panels, png):
        written["png"] = str(png)
    return written


def checkpoint_updates(save_dir: Path) -> Dict[int, Path]:
    """``{update: path}`` of the interval checkpoints ``checkpoint_<epoch>_<update>.pt``."""
    out = {}
    if save_dir.is_dir():
        for p in save_dir.iterdir():
            m = _CHECKPOINT_RE.match(p.name)
            if m:
                out[int(m.group(2))] = p
    return out


def common_update(checkpoints: Mapping[str, Mapping[int, Path]]) -> Optional[int]:
    """The largest update at which every arm (with any checkpoint) saved one."""
    sets = [set(c) for c in checkpoints.values() if c]
    if not sets:
        return None
    common = set.intersection(*sets)
    return max(common) if common else None


def arm_outcome(job: Job, curves: Mapping[str, curve_logs.Curve], log: Path, max_update: int) -> dict:
    seen = [max(c) for c in curves.values() if c]
    last = max(seen) if seen else 0
    stopped = job.status
    if job.status == "done":
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
        stopped = "stop_time" if _STOP_TIME_MSG in text else ("max_update" if last >= max_update else "done")
    valid = curves.get("valid_loss") or {}
    return {"last_update": last, "ended_by": stopped,
            "last_valid_loss": valid[max(valid)] if valid else None}


# ------------------------------------------------------------------------------------------------
# the whole study
# ------------------------------------------------------------------------------------------------
def _finish_phase(group: GradInitGroup, tmp: Path) -> Callable[[Job], None]:
    def finish(job: Job) -> None:
        scales = tmp / "gradinit.json"
        if not scales.is_file():
            raise RuntimeError(f"the GradInit phase ended without writing {scales}")
        (tmp / "fingerprint.json").write_text(json.dumps(group.fingerprint, indent=1, sort_keys=True) + "\n")
        shutil.move(str(job.log), str(tmp / "gradinit.log"))
        job.log = group.dir / "gradinit.log"
        if group.dir.exists():  # a stale or foreign entry under the same key: replace it
            shutil.rmtree(group.dir)
        os.replace(tmp, group.dir)
        group.cached = True
    return finish


def group_entry(group: GradInitGroup, phase: Optional[Job], t0: float) -> dict:
    """``study.json``'s entry of a GradInit group: its scales file only if it exists, whether this
    study computed it, and the phase's outcome (a failed phase's log is where the failure moved it)."""
    entry = {"arms": group.arms, "scales": str(group.scales_file) if group.scales_file.is_file() else None,
             "computed_now": phase is not None and phase.status == "done",
             "phase": phase.summary(t0) if phase is not None else None}
    if entry["scales"] is None:
        entry["error"] = (f"no scales: the GradInit phase {phase.status}" + (f" ({phase.reason})" if phase.reason else "")
                          + f"; see {phase.log}" if phase is not None else "no scales and no phase ran")
    return entry


def run_study(cfg: StudyConfig) -> dict:
    """Plan, run (GradInit phases, arms, BLEU) and write the results; returns ``study.json``'s content."""
    out = Path(cfg.out)
    plans, groups = plan_study(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "arms").mkdir(exist_ok=True)
    for p in plans:
        if p.train and p.save_dir.exists() and any(p.save_dir.iterdir()):
            raise ValueError(f"{p.save_dir} is not empty: fairseq would resume from it; use a new --out "
                             "or remove the arm's folder")
    env = subprocess_env(cfg)
    t0 = time.time()
    deadline = t0 + cfg.time_budget_s if cfg.time_budget_s else None

    jobs: List[Job] = []
    for key, g in groups.items():
        if g.cached:
            logger.info("study: GradInit group gi-%s (%s): reusing %s", key, ", ".join(g.arms), g.scales_file)
            continue
        tmp = cfg.cache_dir / f".gi-{key}.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        jobs.append(Job(name=f"gi-{key}", kind="phase", cmd=phase_command(cfg, g, tmp), log=tmp / "gradinit.log.part",
                        on_success=_finish_phase(g, tmp)))
    phase_names = {j.name for j in jobs}
    arm_jobs: Dict[str, Job] = {}
    for p in plans:
        if not p.train:
            continue
        deps = (f"gi-{p.group}",) if p.group is not None and f"gi-{p.group}" in phase_names else ()
        job = Job(name=p.arm.name, kind="arm", cmd=arm_command(cfg, p, groups), log=p.save_dir / "train.log",
                  deps=deps, stop_time=True)
        arm_jobs[p.arm.name] = job
        jobs.append(job)
    logger.info("study: %d GradInit phase(s) to run, %d cached; %d arm(s)", len(phase_names),
                sum(g.cached for g in groups.values()), len(arm_jobs))
    try:
        run_jobs(jobs, parallel=cfg.parallel, deadline=deadline, finish_margin_s=cfg.finish_margin_s, env=env,
                 cwd=REPO_ROOT)
    finally:  # also on Ctrl-C: no temporary folder stays in the cache
        for j in jobs:  # failed, killed or never started phases: keep their log beside the cache
            if j.kind == "phase" and j.status != "done":
                tmp = j.log.parent
                if tmp.exists():
                    failed = cfg.cache_dir / f"failed-{j.name}"
                    shutil.rmtree(failed, ignore_errors=True)
                    os.replace(tmp, failed)
                    j.log = failed / j.log.name
    t_train = time.time()

    all_curves = {name: arm_curves(job.log) for name, job in arm_jobs.items()}
    written = write_curves(out, all_curves) if arm_jobs else {}
    arms_out = {}
    for p in plans:
        entry = {"args": p.arm.spec(), "note": p.arm.note, "data": p.data, "trained": p.train,
                 "gradinit_group": f"gi-{p.group}" if p.group else None}
        if p.train:
            job = arm_jobs[p.arm.name]
            entry.update(command=shlex.join(job.cmd), run=job.summary(t0),
                         **arm_outcome(job, all_curves[p.arm.name], job.log, cfg.max_update))
        arms_out[p.arm.name] = entry

    bleu = run_bleu(cfg, plans, env) if cfg.bleu and arm_jobs else None
    result = {
        "out": str(out),
        "data": {k: str(v) for k, v in cfg.data.items()},
        "base": shlex.join(cfg.base),
        "settings": {"parallel": cfg.parallel, "time_budget_s": cfg.time_budget_s, "finish_margin_s": cfg.finish_margin_s,
                     "max_update": cfg.max_update, "valid_every": cfg.valid_every, "save_every": cfg.save_every,
                     "cpu": cfg.cpu},
        "gradinit_groups": {f"gi-{k}": group_entry(g, next((j for j in jobs if j.name == f"gi-{k}"), None), t0)
                            for k, g in groups.items()},
        "arms": arms_out,
        "files": written,
        "bleu": bleu,
        "wall_s": {"gradinit_and_training": round(t_train - t0, 1), "total": round(time.time() - t0, 1)},
    }
    (out / "study.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def run_bleu(cfg: StudyConfig, plans: Sequence[ArmPlan], env: Mapping[str, str]) -> dict:
    """BLEU of every arm at the largest checkpoint update that all arms with checkpoints reached."""
    trained = [p for p in plans if p.train]
    ckpts = {p.arm.name: checkpoint_updates(p.save_dir) for p in trained}
    without = sorted(n for n, c in ckpts.items() if not c)
    update = common_update(ckpts)
    # The authors' length limits: untrained arms otherwise decode every sentence to fairseq's maximum.
    gen_args = merge_args(BLEU_LENGTH_LIMITS, list(cfg.bleu_args))
    result = {"update": update, "beam": 5, "subset": cfg.bleu_subset, "reference": cfg.bleu_ref or "T- lines",
              "generate_args": gen_args, "arms": {}, "no_checkpoint": without}

    def no_score(p: ArmPlan, reason: str) -> None:
        (p.save_dir / "bleu.json").write_text(json.dumps({"bleu": None, "reason": reason}, indent=1) + "\n")

    for p in trained:
        if p.arm.name in without:
            no_score(p, "no checkpoint was saved (the arm ended before --save-every updates)")
    if update is None:
        result["error"] = "no checkpoint update common to all arms; lower --save-every"
        for p in trained:
            if p.arm.name not in without:
                no_score(p, result["error"])
        (Path(cfg.out) / "bleu.json").write_text(json.dumps(result, indent=1) + "\n")
        return result
    if not Path(cfg.bleu_script).is_file():
        raise ValueError(f"BLEU script not found: {cfg.bleu_script} (run from a source checkout, or --no-bleu)")
    jobs, outputs = [], {}
    for p in trained:
        if p.arm.name in without:
            continue
        out_json = outputs[p.arm.name] = p.save_dir / "bleu.json"
        cmd = [cfg.python, str(cfg.bleu_script), p.data, "--path", str(ckpts[p.arm.name][update]),
               "--user-dir", "gradinit", "--beam", "5", "--gen-subset", cfg.bleu_subset,
               "--output-json", str(out_json)]
        if cfg.cpu:
            cmd.append("--cpu")
        if cfg.bleu_ref:
            cmd += ["--ref", str(cfg.bleu_ref)]
        cmd += ["--", *gen_args]
        jobs.append(Job(name=p.arm.name, kind="bleu", cmd=cmd, log=p.save_dir / "bleu.log"))
    t0 = time.time()
    run_jobs(jobs, parallel=cfg.parallel, env=env, cwd=REPO_ROOT,
             deadline=t0 + cfg.bleu_budget_s if cfg.bleu_budget_s else None)
    for job in jobs:
        entry = {"checkpoint": str(ckpts[job.name][update]), **job.summary(t0)}
        out_json = outputs[job.name]
        if job.status == "done" and out_json.is_file():
            scored = json.loads(out_json.read_text())
            entry.update({k: scored.get(k) for k in ("bleu", "signature", "n_sentences", "bleu_string")})
        else:
            entry["reason"] = (f"BLEU step {job.status}" + (f" ({job.reason})" if job.reason else "")
                               + f"; see {job.log}")
            no_score(next(p for p in trained if p.arm.name == job.name), entry["reason"])
        result["arms"][job.name] = entry
    (Path(cfg.out) / "bleu.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def export_results(out: Path, dest: Path, groups: Sequence[str], cache_dir: Path) -> List[str]:
    """Copy the summary files to ``dest`` and pack the logs (``logs.tar.gz``: every arm's
    ``train.log``/``bleu.json``/``bleu.log``) and the GradInit groups of this study
    (``gradinit.tar.gz``, to unpack into a ``--gradinit-cache`` folder): few files, no checkpoints."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("study.json", "curves.csv", "curves.png", "curves.md", "bleu.json"):
        if (out / name).is_file():
            shutil.copy2(out / name, dest / name)
            written.append(str(dest / name))
    with tarfile.open(dest / "logs.tar.gz", "w:gz") as tar:
        for arm_dir in sorted((out / "arms").iterdir()) if (out / "arms").is_dir() else []:
            for name in ("train.log", "bleu.json", "bleu.log"):
                if (arm_dir / name).is_file():
                    tar.add(arm_dir / name, arcname=f"{arm_dir.name}/{name}")
    written.append(str(dest / "logs.tar.gz"))
    with tarfile.open(dest / "gradinit.tar.gz", "w:gz") as tar:
        for g in groups:
            for path in (cache_dir / g, cache_dir / f"failed-{g}"):
                if path.is_dir():
                    tar.add(path, arcname=path.name)
    written.append(str(dest / "gradinit.tar.gz"))
    return written


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------
def _key_value(kind: str):
    def parse(text: str) -> Tuple[str, str]:
        key, sep, value = text.partition("=")
        if not sep or not key or not value:
            raise argparse.ArgumentTypeError(f"{kind} expects KEY=PATH, got {text!r}")
        return key, value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="study.py",
        description="Run named fairseq-train arms (extra arguments on a common base) on one data-bin within a "
                    "wall-time budget; GradInit scales computed once per configuration and reused; curves "
                    "(CSV, PNG, Markdown) and BLEU at the largest common checkpoint, in the same run.")
    p.add_argument("data", nargs="?", help="the main fairseq data-bin")
    p.add_argument("--out", type=Path, help="output folder (arms/NAME/, gradinit/, curves.*, bleu.json, study.json)")
    p.add_argument("--preset", help="a preset's base and arms (see --list-presets)")
    p.add_argument("--list-presets", action="store_true", help="describe the presets and exit")
    p.add_argument("--call", help="the preset's named GPU call: its arms and the arms it prepares")
    p.add_argument("--arms", help="comma-separated arm names to train (default: all arms given)")
    p.add_argument("--prepare-arms", help="comma-separated arms whose GradInit scales are computed into the "
                                          "cache but which are not trained (for a later run)")
    p.add_argument("--arm", action="append", default=[], metavar="NAME[@DATA]=ARGS",
                   help="an arm: extra fairseq-train arguments; '!--flag' drops a base option; @DATA trains "
                        "on --data-bin DATA. Repeatable")
    p.add_argument("--arms-file", type=Path, help="arms, one NAME[@DATA]=ARGS per line ('#' comments)")
    p.add_argument("--base-args", default="", help="fairseq-train arguments for every arm, after the preset's base")
    p.add_argument("--data-bin", action="append", default=[], type=_key_value("--data-bin"), metavar="KEY=PATH",
                   help="another data-bin for arms NAME@KEY (the screen's separate-dictionary arm: separate=PATH)")
    p.add_argument("--file", action="append", default=[], type=_key_value("--file"), metavar="KEY=PATH",
                   help="a file for {KEY} in arm arguments (presets give defaults)")
    p.add_argument("--parallel", type=int, default=1,
                   help="processes at once: GradInit phases first, then arms (one GPU: the number of arms; CPU: 1)")
    p.add_argument("--time-budget", type=float, help="minutes for the GradInit phases and training; each arm gets "
                                                     "--stop-time-hours from what is left, stragglers are killed")
    p.add_argument("--finish-margin", type=float, default=None,
                   help="seconds of the budget kept for an arm's start-up, last validation and checkpoint (default 30)")
    p.add_argument("--max-update", type=int, help="updates per arm (default: the preset's, else 3000)")
    p.add_argument("--valid-every", type=int, help="validate and log every N updates (default: preset's, else 100)")
    p.add_argument("--save-every", type=int, help="checkpoint every N updates (default: preset's, else 500)")
    p.add_argument("--cpu", action="store_true", help="train, run GradInit and translate on the CPU")
    p.add_argument("--no-bleu", action="store_true", help="skip BLEU")
    p.add_argument("--bleu-ref", help="raw reference file of the BLEU subset (else fairseq's T- lines)")
    p.add_argument("--bleu-subset", default="test", help="binarized split BLEU translates (default: test)")
    p.add_argument("--bleu-args", default="", help="more fairseq-generate arguments, e.g. '--max-len-b 50' "
                   "(default length limits: --max-len-a 1.2 --max-len-b 10)")
    p.add_argument("--bleu-budget", type=float, help="minutes for the BLEU step (running translations are killed)")
    p.add_argument("--gradinit-cache", type=Path, help="folder of computed GradInit groups (default OUT/gradinit); "
                                                       "share it between studies to reuse scales")
    p.add_argument("--export", type=Path, help="also copy the summaries and pack logs and scales here (few files)")
    p.add_argument("--dry-run", action="store_true", help="validate, print the plan (commands, groups) and exit")
    p.add_argument("--bleu-script", type=Path, default=DEFAULT_BLEU_SCRIPT, help=argparse.SUPPRESS)
    return p


def _select(arms: Sequence[Arm], names: Optional[str], what: str) -> List[Arm]:
    if names is None:
        return list(arms)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    by_name = {a.name: a for a in arms}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"{what}: unknown arm(s) {unknown}; known: {', '.join(by_name)}")
    return [by_name[n] for n in wanted]


def config_from_args(args: argparse.Namespace) -> StudyConfig:
    from .study_presets import get_preset

    preset = get_preset(args.preset) if args.preset else None
    arms = list(preset.arms) if preset else []
    arms += [parse_arm_spec(s) for s in args.arm]
    if args.arms_file:
        arms += read_arms_file(args.arms_file)
    train_names, prepare_names = args.arms, args.prepare_arms
    if args.call:
        if preset is None:
            raise ValueError("--call needs --preset")
        call = preset.call(args.call)
        if train_names or prepare_names:
            raise ValueError("--call already chooses the arms; drop --arms/--prepare-arms")
        train_names, prepare_names = ",".join(call.arms), ",".join(call.prepare) or None
    selected = _select(arms, train_names, "--arms")
    prepare = _select(arms, prepare_names, "--prepare-arms") if prepare_names else []
    if args.data is None:
        raise ValueError("the main data-bin (first argument) is required")
    if args.out is None:
        raise ValueError("--out DIR is required")
    data = {"main": args.data, **dict(args.data_bin)}
    files = dict(preset.resolved_files(REPO_ROOT)) if preset else {}
    files.update(dict(args.file))

    def pick(value, attr, default):
        return value if value is not None else getattr(preset, attr, None) or default

    return StudyConfig(
        data=data, out=args.out, arms=tuple(selected), prepare=tuple(prepare),
        base=tuple((preset.base if preset else ())) + tuple(shlex.split(args.base_args)), files=files,
        parallel=args.parallel,
        time_budget_s=(args.time_budget * 60 if args.time_budget is not None else None),
        finish_margin_s=args.finish_margin if args.finish_margin is not None else 30.0,
        max_update=pick(args.max_update, "max_update", 3000), valid_every=pick(args.valid_every, "valid_every", 100),
        save_every=pick(args.save_every, "save_every", 500), cpu=args.cpu, bleu=not args.no_bleu,
        bleu_ref=args.bleu_ref, bleu_subset=args.bleu_subset, bleu_args=tuple(shlex.split(args.bleu_args)),
        bleu_budget_s=args.bleu_budget * 60 if args.bleu_budget is not None else None,
        bleu_script=args.bleu_script, gradinit_cache=args.gradinit_cache,
    )


def describe_plan(cfg: StudyConfig, plans: Sequence[ArmPlan], groups: Mapping[str, GradInitGroup]) -> str:
    lines = []
    for key, g in groups.items():
        state = "cached" if g.cached else "to compute"
        lines.append(f"GradInit group gi-{key} ({state}, {g.dir}): {', '.join(g.arms)}")
    for p in plans:
        if p.train:
            lines.append(f"arm {p.arm.name}: " + shlex.join(arm_command(cfg, p, groups)))
        else:
            lines.append(f"prepare {p.arm.name}: GradInit group gi-{p.group}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None, *, bleu_script: Optional[Path] = None) -> int:
    args = build_parser().parse_args(argv)
    if bleu_script is not None:
        args.bleu_script = bleu_script
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    from . import task as _task  # noqa: F401  (the task's options must be known to fairseq's parser)
    from .study_presets import describe_presets

    if args.list_presets:
        print(describe_presets())  # noqa: T201 - command output
        return 0
    try:
        cfg = config_from_args(args)
        if args.dry_run:
            plans, groups = plan_study(cfg)
            print(describe_plan(cfg, plans, groups))  # noqa: T201
            return 0
        result = run_study(cfg)
        if args.export:
            exported = export_results(Path(cfg.out), args.export, list(result["gradinit_groups"]), cfg.cache_dir)
            logger.info("study: exported %s", ", ".join(exported))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        print(f"study: interrupted (Ctrl-C); its jobs were stopped and no study.json was written. Rerun with a new "
              f"--out (finished GradInit phases stay cached in {cfg.cache_dir})", file=sys.stderr)  # noqa: T201
        return 130
    print(summary_table(result))  # noqa: T201
    failed = [n for n, a in result["arms"].items() if a.get("trained") and a["run"]["status"] in ("failed", "skipped")]
    return 1 if failed else 0


def summary_table(result: Mapping) -> str:
    """A short text table: per arm, how it ended, its last update, last validation loss and BLEU."""
    lines = ["arm | ended by | last update | valid loss (last) | BLEU"]
    bleu = (result.get("bleu") or {}).get("arms", {})
    for name, a in result["arms"].items():
        if not a.get("trained"):
            continue
        b = bleu.get(name, {}).get("bleu")
        lines.append(f"{name} | {a.get('ended_by')} | {a.get('last_update')} | {a.get('last_valid_loss', '–')} | "
                     f"{'–' if b is None else f'{b:.2f}'}")
    update = (result.get("bleu") or {}).get("update")
    if update is not None:
        lines.append(f"(BLEU at update {update}, the largest checkpoint every arm reached)")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "gradinit-phase":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                            stream=sys.stdout)
        sys.exit(gradinit_phase_main(sys.argv[2:]))
    sys.exit(main())
