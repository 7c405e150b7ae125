"""Command line of the study runner (``python -m lab.study``)."""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from fairseq_gradinit.command_line.quiet import quiet_command
from fairseq_gradinit.files.locks import FolderBusy, folder_lock
from fairseq_gradinit.files.paths import FOLDER, check_output, tar_gz_output

from .archive import COMMAND, SUMMARY_FILES, check_archive_path, pack_study
from .arms import Arm, parse_arm_spec, read_arms_file
from .estimate import GPU_THROUGHPUT, THROUGHPUT, CallEstimate, estimate_call, plan_jobs
from .merge import earlier_study
from .plan import REPO_ROOT, ArmPlan, GradInitGroup, StudyConfig, arm_command, check_bleu_step, plan_study
from .results import export_results, summary_table
from .runner import bleu_budget_s, run_study

logger = logging.getLogger(__name__)


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
        prog="python -m lab.study",
        description="Run named fairseq-train arms (extra arguments on a common base) on one data-bin within a "
                    "wall-time budget; GradInit scales computed once per configuration and reused; curves "
                    "(CSV, PNG, Markdown) and BLEU at the largest common checkpoint, in the same run.")
    p.add_argument("data", nargs="?", help="the main fairseq data-bin")
    p.add_argument("--out", type=Path, help="output folder (arms/NAME/, gradinit/, curves.*, bleu.json, study.json)")
    p.add_argument("--preset", help="a preset's base and arms (see --list-presets)")
    p.add_argument("--list-presets", nargs="?", const="", default=None, metavar="NAME",
                   help="say what each preset answers and how long it takes, or describe preset NAME in full "
                        "(arms, calls, estimates), and exit")
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
    p.add_argument("--parallel", type=int, default=None,
                   help="processes at once: GradInit phases first, then arms (one GPU: the number of arms; CPU: one "
                        "per core; default: the --call's, else the preset's, else 1)")
    p.add_argument("--time-budget", type=float, help="minutes for the GradInit phases and training; each arm gets "
                                                     "--stop-time-hours from what is left, stragglers are killed "
                                                     "(default: the --call's)")
    p.add_argument("--finish-margin", type=float, default=None,
                   help="seconds of the budget kept for an arm's start-up, last validation and checkpoint "
                        "(default: the --call's, else 30)")
    p.add_argument("--max-update", type=int, help="updates per arm (default: the preset's, else 3000)")
    p.add_argument("--valid-every", type=int, help="validate and log every N updates (default: preset's, else 100)")
    p.add_argument("--save-every", type=int, help="checkpoint every N updates (default: preset's, else 500)")
    p.add_argument("--cpu", action="store_true", help="train, run GradInit and translate on the CPU")
    p.add_argument("--no-bleu", action="store_true", help="skip BLEU")
    p.add_argument("--bleu-ref", help="raw reference file of the BLEU subset (else fairseq's T- lines)")
    p.add_argument("--bleu-subset", default="test", help="binarized split BLEU translates (default: test)")
    p.add_argument("--bleu-best", action="store_true", help="also translate each arm's checkpoint with the lowest "
                   "validation loss where it is not the one translated (bleu.json: the arm's 'best')")
    p.add_argument("--bleu-args", default="", help="more fairseq-generate arguments, e.g. '--max-len-b 50' "
                   "(default length limits: --max-len-a 1.2 --max-len-b 10)")
    p.add_argument("--bleu-budget", type=float, help="minutes for the BLEU step; each translation gets its round's "
                   "share and stops once its measured rate cannot finish in it (default: the --call's, else with "
                   "--time-budget 0.5 per round of --bleu-parallel translations, else no limit)")
    p.add_argument("--bleu-parallel", type=int, default=None,
                   help="translations at once in the BLEU step; each gets an equal share of the host's cores "
                        "(default: --parallel; 1: one at a time, each with the whole GPU and host)")
    p.add_argument("--gradinit-cache", type=Path, help="folder of computed GradInit groups (default OUT/gradinit); "
                                                       "share it between studies to reuse scales")
    p.add_argument("--export", type=Path, help="also copy the summaries and pack logs and scales here (few files)")
    p.add_argument("--archive", type=Path, metavar="PATH.tar.gz",
                   help="also pack everything the study exports into this one file (summaries, curves, every "
                        "arm's train.log, bleu.json, bleu.log, monitor.jsonl, gradinit.json, and its GradInit "
                        "groups under gradinit/; no checkpoints), also when the study fails or is interrupted")
    p.add_argument("--gpu", choices=GPU_THROUGHPUT,
                   help="the GPU whose measured throughput estimates the durations the plan prints (default: "
                        "the preset's; no estimate on the CPU or for a setting without figures)")
    p.add_argument("--dry-run", action="store_true", help="validate, print the plan (commands, groups) and the "
                                                          "estimated durations, and exit (1 if the --call's "
                                                          "estimate exceeds its limit)")
    p.add_argument("--bleu-script", type=Path, default=None, help=argparse.SUPPRESS)
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


def _seed_twins(preset, call, arms: Sequence[Arm], train_names: Optional[str], prepare_names: Optional[str]):
    """A repeat call's arms: the seed twins of the arms named by --arms/--prepare-arms, and their names."""
    from .presets import seed_twin

    if not train_names and not prepare_names:
        raise ValueError(f"call {call.name} of preset {preset.name} repeats the arms you name at seed "
                         f"{call.repeat_seed}: pass --arms NAME[,NAME] (or --prepare-arms NAME[,NAME] to compute "
                         "their GradInit scales into the cache first)")
    twins = {}
    for names, what in ((train_names, "--arms"), (prepare_names, "--prepare-arms")):
        for arm in _select(arms, names, what) if names else []:
            twins[arm.name] = seed_twin(preset, arm, call.repeat_seed)

    def renamed(names):  # "" (none), not None (all)
        return ",".join(twins[n.strip()].name for n in names.split(",") if n.strip()) if names else ""

    return list(twins.values()), renamed(train_names), renamed(prepare_names)


def config_from_args(args: argparse.Namespace) -> StudyConfig:
    from .presets import get_preset

    preset = get_preset(args.preset) if args.preset else None
    arms = list(preset.arms) if preset else []
    arms += [parse_arm_spec(s) for s in args.arm]
    if args.arms_file:
        arms += read_arms_file(args.arms_file)
    train_names, prepare_names = args.arms, args.prepare_arms
    call = None
    if args.call:
        if preset is None:
            raise ValueError("--call needs --preset")
        call = preset.call(args.call)
        if call.repeat_seed is not None:
            arms, train_names, prepare_names = _seed_twins(preset, call, arms, train_names, prepare_names)
        elif train_names or prepare_names:
            raise ValueError("--call already chooses the arms; drop --arms/--prepare-arms")
        else:
            train_names, prepare_names = ",".join(call.arms), ",".join(call.prepare) or None
    selected = _select(arms, train_names, "--arms")
    prepare = _select(arms, prepare_names, "--prepare-arms") if prepare_names else []
    if args.data is None:
        raise ValueError("the main data-bin (first argument) is required")
    if args.out is None:
        raise ValueError("--out DIR is required")
    from fairseq_gradinit.fairseq_plugin.data.files import unwritable_folder_reason

    for flag, folder in (("--out", args.out), ("--gradinit-cache", args.gradinit_cache)):
        reason = unwritable_folder_reason(str(folder)) if folder is not None else None
        if reason:  # before anything runs, not when the first result is written
            raise ValueError(f"{flag} {folder} {reason}; give a folder you can write")
    # Every path the user gave is the caller's (relative to this working folder); the arms run in
    # the same folder, and the study records absolute paths.
    data = {key: os.path.abspath(path) for key, path in {"main": args.data, **dict(args.data_bin)}.items()}
    files = dict(preset.resolved_files(REPO_ROOT)) if preset else {}
    files.update({key: os.path.abspath(path) for key, path in args.file})

    def pick(value, attr, default):
        return value if value is not None else getattr(preset, attr, None) or default

    def from_call(value, attr, default=None):
        if value is not None:
            return value
        own = getattr(call, attr, None) if call is not None else None
        return own if own is not None else default

    time_budget = from_call(args.time_budget, "time_budget")
    bleu_budget = from_call(args.bleu_budget, "bleu_budget")

    return StudyConfig(
        data=data, out=Path(os.path.abspath(args.out)), arms=tuple(selected), prepare=tuple(prepare),
        base=tuple((preset.base if preset else ())) + tuple(shlex.split(args.base_args)), files=files,
        parallel=from_call(args.parallel, "parallel", getattr(preset, "parallel", None) or 1),
        time_budget_s=(time_budget * 60 if time_budget is not None else None),
        finish_margin_s=from_call(args.finish_margin, "finish_margin", 30.0),
        max_update=pick(args.max_update, "max_update", 3000), valid_every=pick(args.valid_every, "valid_every", 100),
        save_every=pick(args.save_every, "save_every", 500), cpu=args.cpu, bleu=not args.no_bleu,
        bleu_ref=os.path.abspath(args.bleu_ref) if args.bleu_ref else None, bleu_subset=args.bleu_subset,
        bleu_args=tuple(shlex.split(args.bleu_args)),
        bleu_budget_s=bleu_budget * 60 if bleu_budget is not None else None, bleu_parallel=args.bleu_parallel,
        bleu_script=Path(os.path.abspath(args.bleu_script)) if args.bleu_script is not None else None,
        bleu_best=args.bleu_best,
        gradinit_cache=Path(os.path.abspath(args.gradinit_cache)) if args.gradinit_cache else None,
    )


def check_study_paths(args: argparse.Namespace, cfg: StudyConfig) -> None:
    """Before anything runs: no folder or file the study writes (``--out``, ``--gradinit-cache``,
    ``--export``, ``--archive``) is one of its inputs or a file of another kind, each can be written, and
    the BLEU step's inputs are usable (ValueError)."""
    inputs = {"data-bin": list(cfg.data.values()), "--file": list(cfg.files.values()), "--bleu-ref": cfg.bleu_ref,
              "--arms-file": args.arms_file}
    arm_dirs = tuple(f"arms/{arm.name}" for arm in cfg.arms)  # an earlier arm's files may be inputs
    check_output("--out", cfg.out, FOLDER, inputs=inputs, writes=SUMMARY_FILES + arm_dirs)
    if cfg.gradinit_cache is not None:
        check_output("--gradinit-cache", cfg.gradinit_cache, FOLDER, inputs=inputs)
    if args.export is not None:  # it gets copies of --out's summaries
        check_output("--export", args.export, FOLDER, writes=SUMMARY_FILES + ("logs.tar.gz", "gradinit.tar.gz"),
                     inputs={**inputs, "--out": [cfg.out / name for name in SUMMARY_FILES]})
    if args.archive is not None:
        check_output("--archive", args.archive, tar_gz_output(COMMAND), inputs={**inputs, "--out": cfg.out})
    if cfg.bleu and cfg.arms:
        check_bleu_step(cfg)
    earlier_study(cfg)  # an earlier study in --out must be one whose arms can be merged with these


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


def study_estimate(cfg: StudyConfig, plans: Sequence[ArmPlan], groups: Mapping[str, GradInitGroup], *,
                   gpu: Optional[str], limit_s: Optional[float] = None) -> Tuple[Optional[CallEstimate], str]:
    """The estimated durations of a planned study on ``gpu`` (its measured figures), or None and why not."""
    if cfg.cpu and (gpu is None or not THROUGHPUT[gpu].cpu):
        return None, "no estimate on the CPU (the throughput figures are measured on GPUs)"
    if gpu is not None and not cfg.cpu and THROUGHPUT[gpu].cpu:
        gpu = None  # a CPU's figures say nothing of a GPU run
    if gpu is None:
        return None, ("no estimate: no throughput figures for this setting (they are for the d=512 presets; "
                      "--gpu h200|h100 applies them)")
    n_arms = sum(p.train for p in plans)
    bleu = bleu_budget_s(cfg, n_arms) if cfg.bleu and n_arms else 0.0
    est = estimate_call(plan_jobs(plans, groups, max_update=cfg.max_update), throughput=THROUGHPUT[gpu],
                        parallel=cfg.parallel, time_budget_s=cfg.time_budget_s, finish_margin_s=cfg.finish_margin_s,
                        bleu_s=bleu or 0.0, bleu_budget_s=bleu, limit_s=limit_s)
    if cfg.bleu and n_arms and bleu is None:
        est.notes.append("BLEU not included: no --bleu-budget and no measured decode rate to size it "
                         "(bleu.json records the rate of each run)")
    return est, ""


def _log_to_file(out: Path) -> logging.Handler:
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "study.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


def main(argv: Optional[Sequence[str]] = None, *, bleu_script: Optional[Path] = None) -> int:
    args = build_parser().parse_args(argv)
    if bleu_script is not None:
        args.bleu_script = bleu_script
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    from fairseq_gradinit.fairseq_plugin.registration import task as _task  # noqa: F401  (the task's options must be known to fairseq's parser)
    from .presets import describe_presets, get_preset, list_presets

    if args.list_presets is not None:
        try:
            text = describe_presets((get_preset(args.list_presets).name,)) if args.list_presets else list_presets()
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)  # noqa: T201
            return 2
        print(text)  # noqa: T201 - command output
        return 0
    cfg, result, handler = None, None, None
    try:
        if args.archive is not None:
            check_archive_path(args.archive)
        cfg = config_from_args(args)
        check_study_paths(args, cfg)
        preset = get_preset(args.preset) if args.preset else None
        call = preset.call(args.call) if preset is not None and args.call else None
        gpu = args.gpu or (preset.throughput if preset is not None else None)
        if args.dry_run:
            plans, groups = plan_study(cfg)
            print(describe_plan(cfg, plans, groups))  # noqa: T201
            est, why = study_estimate(cfg, plans, groups, gpu=gpu, limit_s=call.limit_s if call else None)
            print(est.describe() if est is not None else why)  # noqa: T201
            if est is None and preset is not None and preset.duration:
                print(f"duration of preset {preset.name} where measured: {preset.duration}")  # noqa: T201
            if est is not None and est.limit_s is not None and not est.fits:
                to_compute = sum(not g.cached for g in groups.values())
                hint = (f"; {to_compute} GradInit group(s) are still to compute: pass the --gradinit-cache of the "
                        "call that prepared them" if to_compute else "")
                print(f"error: the estimate does not fit call {call.name}'s limit of {est.limit_s:.0f} s "
                      f"(see above): fewer arms at once, a smaller --max-update or a shorter BLEU budget{hint}",
                      file=sys.stderr)  # noqa: T201
                return 1
            return 0
        plans, groups = plan_study(cfg)  # each arm parsed by fairseq's parser before --out is created
        with folder_lock(cfg.out, flag="--out", command=COMMAND):  # one study per --out at a time
            handler = _log_to_file(Path(cfg.out))
            if gpu is not None:
                est, _ = study_estimate(cfg, plans, groups, gpu=gpu, limit_s=call.limit_s if call else None)
                if est is not None:
                    logger.info("study: %s", est.describe())
            with termination_signals_interrupt():
                result = run_study(cfg)
                if args.export:
                    exported = export_results(Path(cfg.out), args.export, list(result["gradinit_groups"]),
                                              cfg.cache_dir)
                    logger.info("study: exported %s", ", ".join(exported))
    except FolderBusy as e:
        print(f"error: {e}", file=sys.stderr)  # noqa: T201
        return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        how = "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
        print(f"study: {how}; its jobs were stopped and no study.json was written. Rerun with a new "
              f"--out (finished GradInit phases stay cached in {cfg.cache_dir if cfg else 'the cache'})",
              file=sys.stderr)  # noqa: T201
        return 128 + signum
    finally:
        if args.archive is not None and cfg is not None and not args.dry_run and Path(cfg.out).is_dir():
            groups_used = list(result["gradinit_groups"]) if result is not None else None
            members = pack_study(Path(cfg.out), args.archive, cache_dir=cfg.cache_dir, groups=groups_used)
            logger.info("study: packed %d files into %s", len(members), args.archive)
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()
    print(summary_table(result))  # noqa: T201
    failed = [n for n, a in result["arms"].items() if a.get("trained") and a["run"]["status"] in ("failed", "skipped")]
    for line in failed_arm_lines(result):
        print(line, file=sys.stderr)  # noqa: T201
    return 1 if failed else 0


class Terminated(KeyboardInterrupt):
    """A termination signal other than SIGINT, handled as Ctrl-C; ``signum`` names it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def termination_signals_interrupt():
    """SIGTERM and SIGHUP (a scheduler, ``timeout``, a closed terminal) end the study as Ctrl-C does:
    its jobs are stopped and its temporary folders cleaned up. Later signals are ignored until then."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signal.SIGTERM, signal.SIGHUP)

    def handler(signum, frame):
        for s in signums:
            signal.signal(s, signal.SIG_IGN)
        raise Terminated(signum)

    previous = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def failed_arm_lines(result: Mapping) -> List[str]:
    """One line per arm that failed or never started, naming the log to read (for an arm whose
    GradInit phase failed: the phase's log)."""
    lines = []
    for name, arm in result["arms"].items():
        run = arm.get("run") or {}
        if not arm.get("trained") or run.get("status") not in ("failed", "skipped"):
            continue
        group = (result.get("gradinit_groups") or {}).get(arm.get("gradinit_group") or "") or {}
        phase = group.get("phase") or {}
        # A failed arm's reason names its log; a skipped one's names the phase that failed.
        log = phase.get("log") if run["status"] == "skipped" and phase.get("status") not in (None, "done") else None
        what = "failed" if run["status"] == "failed" else "did not run"
        lines.append(f"study: arm {name} {what}: {run.get('reason') or 'no reason recorded'}"
                     + (f"; see {log}" if log else ""))
    return lines


#: ``python -m lab.study``: :func:`main` with known third-party warnings hidden, and the commands' one
#: top-level handler of Ctrl-C and OSError (:func:`fairseq_gradinit.command_line.quiet.quiet_command`).
run = quiet_command(main, COMMAND)
