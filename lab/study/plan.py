"""Configuration and plan of a study (arms validated by fairseq's parser, GradInit groups), and the
GradInit phase entry point."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import fairseq_gradinit

from .arms import Arm, has_option, merge_args, substitute_files

#: The library this study runs (its installed location): fairseq's ``--user-dir`` for the arms and the
#: BLEU step, and the folder the subprocesses import it from.
PACKAGE_DIR = Path(fairseq_gradinit.__file__).resolve().parent
#: The checkout holding this lab: the presets' evidence files are relative to it, and the subprocesses
#: import the lab from it.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The BLEU step, run as ``python -m BLEU_MODULE``.
BLEU_MODULE = "fairseq_gradinit.tools.evaluate_bleu"

logger = logging.getLogger(__name__)

#: fairseq-generate's length limits in the BLEU step, as the authors decode (untrained arms otherwise
#: decode every sentence to fairseq's maximum length).
BLEU_LENGTH_LIMITS = ("--max-len-a", "1.2", "--max-len-b", "10")
#: Options the runner sets itself for every arm.
RESERVED_OPTIONS = ("--save-dir", "--stop-time-hours", "--user-dir")


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
    bleu_parallel: Optional[int] = None       # BLEU translations at once (None: as parallel)
    bleu_script: Optional[Path] = None        # a script to run instead of BLEU_MODULE
    bleu_best: bool = False                   # also decode each arm's checkpoint of lowest validation loss
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
        if self.bleu_parallel is not None and (isinstance(self.bleu_parallel, bool)
                                               or not isinstance(self.bleu_parallel, int) or self.bleu_parallel < 1):
            raise ValueError(f"--bleu-parallel must be an integer >= 1, got {self.bleu_parallel!r}")
        for opt in RESERVED_OPTIONS:
            if has_option(self.base, opt):
                raise ValueError(f"the base arguments set {opt}: the study sets it for every arm; remove it")
        if self.time_budget_s is not None and not (0 < self.time_budget_s < math.inf):  # also NaN
            raise ValueError(f"--time-budget must be positive and finite (minutes), got {self.time_budget_s / 60!r}; "
                             "leave it out for no limit")
        for flag, value in (("--max-update", self.max_update), ("--valid-every", self.valid_every),
                            ("--save-every", self.save_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {value!r}")
        if not (self.finish_margin_s >= 0):  # also NaN
            raise ValueError(f"--finish-margin must be >= 0 seconds, got {self.finish_margin_s!r}")
        if self.finish_margin_s == math.inf:
            raise ValueError("--finish-margin must be a finite number of seconds, got inf")
        if self.bleu_budget_s is not None and not (self.bleu_budget_s > 0 and self.bleu_budget_s != float("inf")):
            raise ValueError(f"--bleu-budget must be a positive number of minutes, got {self.bleu_budget_s / 60!r}")

    @property
    def bleu_at_once(self) -> int:
        """BLEU translations at once: ``bleu_parallel``, else ``parallel`` (the budgets are sized for it)."""
        return self.bleu_parallel if self.bleu_parallel is not None else self.parallel

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


def _parse_fairseq_args(argv: Sequence[str], *, arm: str, generate: bool = False):
    """fairseq's own parse of a fairseq-train command line (with the plugin's tasks and models), or of a
    fairseq-generate one (``generate``)."""
    from fairseq import options

    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (registers the plugin's tasks, options and models)

    err = io.StringIO()
    parser = options.get_generation_parser() if generate else options.get_training_parser()
    try:
        with contextlib.redirect_stderr(err):
            return options.parse_args_and_arch(parser, input_args=list(argv))
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        # argparse's "PROG: error: " names whatever program runs the study (python, pytest): keep the reason only
        reason = msg[-1].split(": error: ", 1)[-1] if msg else "bad arguments"
        who = f"{arm}: fairseq-generate rejects them" if generate else f"arm {arm}: fairseq-train rejects its arguments"
        raise ValueError(f"{who}: {reason}") from None


def check_bleu_step(cfg: StudyConfig) -> None:
    """The BLEU step's inputs, checked before any arm trains (ValueError): its split is in the main
    data-bin, ``--bleu-ref`` has one UTF-8 line per sentence of it, and fairseq-generate's parser takes
    ``--bleu-args``."""
    from fairseq_gradinit.tools.evaluate_bleu import data_subsets, reference_problem

    data = Path(cfg.data["main"])
    splits = data_subsets(data) if data.is_dir() else []
    if splits and cfg.bleu_subset not in splits:
        raise ValueError(f"--bleu-subset {cfg.bleu_subset}: {data} has no such split (it has: {', '.join(splits)}); "
                         "pick one of them, or pass --no-bleu")
    if cfg.bleu_ref:
        problem = reference_problem(Path(cfg.bleu_ref), data, cfg.bleu_subset)
        if problem:
            raise ValueError(f"--bleu-ref {problem}")
    _parse_fairseq_args([str(data), "--path", "checkpoint.pt", "--gen-subset", cfg.bleu_subset,
                         *merge_args(BLEU_LENGTH_LIMITS, list(cfg.bleu_args))], arm="--bleu-args", generate=True)


def group_key(fp: Mapping) -> str:
    from fairseq_gradinit.fairseq_plugin.phase.provenance import COMPARED_KEYS, stable_fingerprint

    fp = stable_fingerprint(fp)
    compared = {k: fp.get(k) for k in COMPARED_KEYS}
    return hashlib.sha256(json.dumps(compared, sort_keys=True, default=str).encode()).hexdigest()[:12]


def cached_scales_match(group_dir: Path, fp: Mapping) -> bool:
    """Whether ``group_dir`` holds scales computed for fingerprint ``fp`` (the sidecar
    ``fingerprint.json``, and the one inside ``gradinit.json`` where the task records it)."""
    from fairseq_gradinit.fairseq_plugin.phase.provenance import fingerprint_diff

    scales, side = group_dir / "gradinit.json", group_dir / "fingerprint.json"
    if not scales.is_file() or not side.is_file():
        return False
    try:
        saved = json.loads(side.read_text())
        inner = json.loads(scales.read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError) as e:  # not JSON, or not an object
        logger.warning("study: WARNING: the cached GradInit group %s is damaged (%s: %s); it is computed again",
                       group_dir, type(e).__name__, e)
        return False
    if fingerprint_diff(saved, fp):
        return False
    return inner is None or not fingerprint_diff(inner, fp)


def plan_study(cfg: StudyConfig) -> Tuple[List[ArmPlan], Dict[str, GradInitGroup]]:
    """Each arm's fairseq-train arguments (validated by fairseq's parser) and the GradInit groups."""
    from fairseq_gradinit.fairseq_plugin.phase.provenance import fingerprint_from_args
    from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan

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
        if build_plan(ns).computes:
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
        from fairseq_gradinit.fairseq_plugin.settings.init_file import compute_only_flags

        # The group's phase computed the scales with these settings; the arm only applies them.
        argv = merge_args(argv, ["--gradinit-init-file", str(groups[plan.group].scales_file)],
                          drop=compute_only_flags())
    return [cfg.python, "-m", "fairseq_cli.train", *argv, "--user-dir", str(PACKAGE_DIR),
            "--save-dir", str(plan.save_dir)]


def bleu_command(cfg: StudyConfig) -> List[str]:
    """The start of the BLEU step's command line (its arguments follow)."""
    if cfg.bleu_script is not None:
        return [cfg.python, str(cfg.bleu_script)]
    return [cfg.python, "-m", BLEU_MODULE]


def phase_command(cfg: StudyConfig, group: GradInitGroup, save_dir: Path) -> List[str]:
    return [cfg.python, "-m", "lab.study", "gradinit-phase",
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
    from fairseq.dataclass.initialize import add_defaults
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.fairseq_plugin.data.training import build_from_config

    args = _parse_fairseq_args(argv, arm="gradinit-phase")
    cfg = convert_namespace_to_omegaconf(args)
    add_defaults(cfg)
    if int(cfg.distributed_training.distributed_world_size) > 1:
        raise ValueError("the GradInit phase runs in one process: --distributed-world-size must be 1")
    from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan

    if not build_plan(cfg.task).computes:
        raise ValueError("the GradInit phase needs --gradinit-iters N > 0 and no --gradinit-init-file")
    build_from_config(cfg)  # the task runs GradInit in build_criterion and writes save_dir/gradinit.json
    out = Path(cfg.checkpoint.save_dir) / "gradinit.json"
    if not out.is_file():
        raise RuntimeError(f"GradInit ran but {out} was not written")
    return 0
