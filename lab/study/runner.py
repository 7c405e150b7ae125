"""The whole study: plan, GradInit phases, arms, curves and BLEU (:func:`run_study`)."""
from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_gradinit.files.paths import write_json

from .arms import merge_args
from .merge import earlier_arms, earlier_study, merge_results
from .plan import (
    BLEU_LENGTH_LIMITS,
    PACKAGE_DIR,
    ArmPlan,
    GradInitGroup,
    StudyConfig,
    arm_command,
    bleu_command,
    phase_command,
    plan_study,
)
from .results import arm_curves, arm_outcome, checkpoint_updates, common_update, write_curves
from .scheduler import Job, run_jobs, subprocess_env

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------
# the whole study
# ------------------------------------------------------------------------------------------------
def _finish_phase(group: GradInitGroup, tmp: Path) -> Callable[[Job], None]:
    def finish(job: Job) -> None:
        scales = tmp / "gradinit.json"
        if not scales.is_file():
            raise RuntimeError(f"the GradInit phase ended without writing {scales}")
        write_json(tmp / "fingerprint.json", group.fingerprint, sort_keys=True)
        shutil.move(str(job.log), str(tmp / "gradinit.log"))
        job.log = group.dir / "gradinit.log"
        if group.dir.exists():  # a stale or foreign entry under the same key: replace it
            shutil.rmtree(group.dir)
        os.replace(tmp, group.dir)
        group.cached = True
    return finish


#: With a --time-budget and no --bleu-budget, the BLEU step gets this many seconds per round of
#: arms decoding at once (a default to override, sized for 1,500 length-limited test
#: sentences of a d=512 model on one GPU, start-up included; not a measurement).
BLEU_SECONDS_PER_ROUND = 30.0
#: Seconds of the BLEU budget left to a translation that stops itself (--time-limit) to write its result.
BLEU_STOP_GRACE_S = 5.0


def host_facts() -> dict:
    """Where the study ran: CPU kernels round differently across processors, so losses repeat to the last digit
    only on one kind of machine."""
    import platform

    import torch

    cpu = platform.processor() or None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        from importlib.metadata import version

        fairseq_version = version("ve-fairseq")
    except Exception:  # noqa: BLE001 - another fairseq distribution, or none
        fairseq_version = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "fairseq": fairseq_version}


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


def bleu_rounds(cfg: StudyConfig, n_arms: int) -> int:
    """How many rounds of :attr:`~.plan.StudyConfig.bleu_at_once` translations the BLEU step of ``n_arms`` takes."""
    return -(-n_arms // cfg.bleu_at_once)


def bleu_budget_s(cfg: StudyConfig, n_arms: int) -> Optional[float]:
    """Seconds for the BLEU step: ``--bleu-budget``, else, in a run with a ``--time-budget``, sized from
    the arms (:data:`BLEU_SECONDS_PER_ROUND` per round of translations at once); else no limit."""
    if cfg.bleu_budget_s is not None:
        return cfg.bleu_budget_s
    if cfg.time_budget_s is None or n_arms == 0:
        return None
    return BLEU_SECONDS_PER_ROUND * bleu_rounds(cfg, n_arms)


def bleu_arm_limit_s(cfg: StudyConfig, budget: Optional[float], n_arms: int) -> Optional[float]:
    """One translation's ``--time-limit``: its round's share of the budget, less the time to write its result
    (rounds run one after the other, so a round that ran over would leave the later ones nothing)."""
    if not budget or n_arms == 0:
        return None
    return max(budget / bleu_rounds(cfg, n_arms) - BLEU_STOP_GRACE_S, 1.0)


def bleu_env(env: Mapping[str, str], decodes_at_once: int) -> Dict[str, str]:
    """The BLEU step's environment: each decode gets an equal share of the cores for its intra-op threads
    (``OMP_NUM_THREADS``) unless the caller's own environment sets them, so that decodes at once do not
    oversubscribe the host their decoding loops run on."""
    out = dict(env)
    if "OMP_NUM_THREADS" not in os.environ:
        out["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // decodes_at_once))
    return out


def _study_jobs(cfg: StudyConfig, plans: Sequence[ArmPlan],
                groups: Mapping[str, GradInitGroup]) -> Tuple[List[Job], Dict[str, Job]]:
    """The GradInit phases still to compute, then the arms (each after its group's phase); and the arms' jobs by name."""
    jobs: List[Job] = []
    for key, g in groups.items():
        if g.cached:
            logger.info("study: GradInit group gi-%s (%s): reusing %s", key, ", ".join(g.arms), g.scales_file)
            continue
        tmp = cfg.cache_dir / f".gi-{key}.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        kept = (f"kept as {g.dir / 'gradinit.log'} when the phase ends, in {cfg.cache_dir / f'failed-gi-{key}'} "
                "if it fails")
        jobs.append(Job(name=f"gi-{key}", kind="phase", cmd=phase_command(cfg, g, tmp), log=tmp / "gradinit.log.part",
                        on_success=_finish_phase(g, tmp), kept_at=kept))
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
    return jobs, arm_jobs


def _keep_failed_phase_logs(cfg: StudyConfig, jobs: Sequence[Job]) -> None:
    """Failed, killed or never started phases: their folder moves beside the cache as ``failed-NAME``."""
    for j in jobs:
        if j.kind == "phase" and j.status != "done":
            tmp = j.log.parent
            if tmp.exists():
                failed = cfg.cache_dir / f"failed-{j.name}"
                shutil.rmtree(failed, ignore_errors=True)
                os.replace(tmp, failed)
                j.log = failed / j.log.name


def run_study(cfg: StudyConfig) -> dict:
    """Plan, run (GradInit phases, arms, BLEU) and write the results; returns ``study.json``'s content."""
    out = Path(cfg.out)
    plans, groups = plan_study(cfg)
    earlier = earlier_study(cfg)  # a study already in --out: its arms are merged with these
    out.mkdir(parents=True, exist_ok=True)
    (out / "arms").mkdir(exist_ok=True)
    for p in plans:
        if p.train and p.save_dir.exists() and any(p.save_dir.iterdir()):
            raise ValueError(f"{p.save_dir} is not empty: fairseq would resume from it; use a new --out "
                             "or remove the arm's folder")
    env = subprocess_env(cfg)
    t0 = time.time()
    deadline = t0 + cfg.time_budget_s if cfg.time_budget_s else None

    jobs, arm_jobs = _study_jobs(cfg, plans, groups)
    phase_names = {j.name for j in jobs if j.kind == "phase"}
    logger.info("study: %d GradInit phase(s) to run, %d cached; %d arm(s)", len(phase_names),
                sum(g.cached for g in groups.values()), len(arm_jobs))
    try:
        run_jobs(jobs, parallel=cfg.parallel, deadline=deadline, finish_margin_s=cfg.finish_margin_s, env=env,
                 cwd=Path.cwd())
    finally:  # also on Ctrl-C: no temporary folder stays in the cache
        _keep_failed_phase_logs(cfg, jobs)
    t_train = time.time()

    all_curves = {name: arm_curves(out / "arms" / name / "train.log")
                  for name, arm in earlier_arms(earlier, arm_jobs).items() if arm.get("trained")}
    all_curves.update({name: arm_curves(job.log) for name, job in arm_jobs.items()})
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

    not_run = {name: job.reason for name, job in arm_jobs.items() if job.started is None}
    bleu = run_bleu(cfg, plans, env, not_run=not_run) if cfg.bleu and arm_jobs else None
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
        "host": host_facts(),
    }
    result = merge_results(earlier, result)
    if earlier and result["bleu"] is not None:
        write_json(out / "bleu.json", result["bleu"])
    write_json(out / "study.json", result)
    return result


def bleu_arm_command(cfg: StudyConfig, p: ArmPlan, checkpoint: Path, out_json: Path, *,
                     time_limit: Optional[float], gen_args: Sequence[str]) -> List[str]:
    """The BLEU step of one arm: the package's BLEU module (or ``--bleu-script``) with the package as ``--user-dir``;
    its progress goes beside ``out_json`` (``bleu.json`` -> ``bleu.progress.json``)."""
    cmd = [*bleu_command(cfg), p.data, "--path", str(checkpoint),
           "--user-dir", str(PACKAGE_DIR), "--beam", "5", "--gen-subset", cfg.bleu_subset,
           "--output-json", str(out_json), "--progress-json", str(out_json.with_suffix(".progress.json"))]
    if cfg.cpu:
        cmd.append("--cpu")
    if "--fp16" in p.argv:  # decoded as trained (fp32 on the CPU, where the script says so)
        cmd.append("--fp16")
    if time_limit:
        # the script stops itself once its measured rate cannot finish in its share and says so
        cmd += ["--time-limit", f"{time_limit:g}"]
    if cfg.bleu_ref:
        cmd += ["--ref", str(cfg.bleu_ref)]
    return cmd + ["--", *gen_args]


def _no_bleu(p: ArmPlan, reason: str, decode: Optional[dict] = None) -> None:
    entry = {"bleu": None, "reason": reason, **({"decode": decode} if decode else {})}
    write_json(p.save_dir / "bleu.json", entry)


def run_bleu(cfg: StudyConfig, plans: Sequence[ArmPlan], env: Mapping[str, str], *,
             not_run: Optional[Mapping[str, str]] = None) -> dict:
    """BLEU of every arm at the largest checkpoint update that all arms with checkpoints reached,
    ``cfg.bleu_at_once`` translations at once, each within its round's share of the budget.

    ``not_run`` maps the arms that never started (their GradInit phase failed, the budget was
    spent) to why: they get their reason in the study's ``bleu.json`` and no folder of their own,
    so that the same ``--out`` takes a rerun of them."""
    not_run = dict(not_run or {})
    trained = [p for p in plans if p.train and p.arm.name not in not_run]
    ckpts = {p.arm.name: checkpoint_updates(p.save_dir) for p in trained}
    without = sorted(n for n, c in ckpts.items() if not c)
    update = common_update(ckpts)
    gen_args = merge_args(BLEU_LENGTH_LIMITS, list(cfg.bleu_args))
    result = {"update": update, "beam": 5, "subset": cfg.bleu_subset, "reference": cfg.bleu_ref or "T- lines",
              "generate_args": gen_args, "no_checkpoint": without,
              "arms": {name: {"bleu": None, "reason": f"the arm did not run ({why})"} for name, why in not_run.items()}}
    for p in trained:
        if p.arm.name in without:
            _no_bleu(p, "no checkpoint was saved (the arm ended before --save-every updates)")
    if update is None:
        result["error"] = "no checkpoint update common to all arms; lower --save-every"
        for p in trained:
            if p.arm.name not in without:
                _no_bleu(p, result["error"])
        write_json((Path(cfg.out) / "bleu.json"), result)
        return result
    if cfg.bleu_script is not None and not Path(cfg.bleu_script).is_file():
        raise ValueError(f"--bleu-script {cfg.bleu_script}: no such file; give a BLEU script, or leave it out "
                         "for the package's own")
    decoding = [p for p in trained if p.arm.name not in without]
    budget = bleu_budget_s(cfg, len(decoding))
    limit = bleu_arm_limit_s(cfg, budget, len(decoding))
    jobs = [Job(name=p.arm.name, kind="bleu", log=p.save_dir / "bleu.log",
                cmd=bleu_arm_command(cfg, p, ckpts[p.arm.name][update], p.save_dir / "bleu.json", time_limit=limit,
                                     gen_args=gen_args)) for p in decoding]
    step_env = bleu_env(env, cfg.bleu_at_once)
    t0 = time.time()
    run_jobs(jobs, parallel=cfg.bleu_at_once, env=step_env, cwd=Path.cwd(), deadline=t0 + budget if budget else None)
    result.update(budget_s=budget, schedule={
        "decodes_at_once": cfg.bleu_at_once, "rounds": bleu_rounds(cfg, len(decoding)), "arm_time_limit_s": limit,
        "omp_num_threads": step_env.get("OMP_NUM_THREADS"), "wall_s": round(time.time() - t0, 1)})
    for job in jobs:
        result["arms"][job.name] = _bleu_entry(job, next(p for p in decoding if p.arm.name == job.name),
                                               ckpts[job.name][update], t0)
    if cfg.bleu_best:
        _decode_best(cfg, decoding, ckpts, update, result, env=step_env, gen_args=gen_args, limit=limit,
                     deadline=t0 + budget if budget else None)
    _summarize_rates(result, cfg, len(decoding))
    write_json((Path(cfg.out) / "bleu.json"), result)
    return result


def best_update(curves: Mapping[str, Mapping[int, float]], updates: Sequence[int]) -> Optional[int]:
    """Of the checkpoint ``updates``, the one with the lowest eval-mode validation loss (the later one of a tie);
    None where none of them was validated."""
    loss = curves.get("valid_loss") or {}
    scored = [u for u in updates if u in loss]
    return min(scored, key=lambda u: (loss[u], -u)) if scored else None


def _decode_best(cfg: StudyConfig, decoding: Sequence[ArmPlan], ckpts: Mapping[str, Mapping[int, Path]],
                 update: int, result: dict, *, env: Mapping[str, str], gen_args: Sequence[str],
                 limit: Optional[float], deadline: Optional[float]) -> None:
    """``--bleu-best``: each arm's checkpoint with the lowest validation loss, decoded too where it is not the one
    decoded at ``update``, into the arm's ``bleu_best.json``; its entry's ``best`` says which update and its score."""
    jobs, best = [], {}
    for p in decoding:
        name = p.arm.name
        b = best_update(arm_curves(p.save_dir / "train.log"), sorted(ckpts[name]))
        best[name] = b
        if b is None:
            result["arms"][name]["best"] = {"update": None, "reason": "no checkpoint update was validated"}
        elif b == update:
            result["arms"][name]["best"] = {"update": b, "same_as_decoded": True}
        else:
            jobs.append(Job(name=name, kind="bleu", log=p.save_dir / "bleu_best.log",
                            cmd=bleu_arm_command(cfg, p, ckpts[name][b], p.save_dir / "bleu_best.json",
                                                 time_limit=limit, gen_args=gen_args)))
    t0 = time.time()
    run_jobs(jobs, parallel=cfg.bleu_at_once, env=env, cwd=Path.cwd(), deadline=deadline)
    for job in jobs:
        out = next(p for p in decoding if p.arm.name == job.name).save_dir / "bleu_best.json"
        scored = json.loads(out.read_text()) if out.is_file() else {}
        entry = {"update": best[job.name], "checkpoint": str(ckpts[job.name][best[job.name]]), **job.summary(t0),
                 "bleu": scored.get("bleu") if job.status == "done" else None,
                 "distinct_hypotheses": scored.get("distinct_hypotheses")}
        if entry["bleu"] is None:
            entry["reason"] = (scored.get("reason") or f"BLEU step {job.status}") + f"; see {job.log}"
        result["arms"][job.name]["best"] = entry


def _bleu_entry(job: Job, p: ArmPlan, checkpoint: Path, t0: float) -> dict:
    """``bleu.json``'s entry of one translation: its job, score or reason, batch settings, rates and time."""
    entry = {"checkpoint": str(checkpoint), **job.summary(t0)}
    out_json = p.save_dir / "bleu.json"
    scored = json.loads(out_json.read_text()) if out_json.is_file() else {}
    progress = job.log.parent / "bleu.progress.json"
    decode = scored.get("decode") or (json.loads(progress.read_text()) if progress.is_file() else None)
    entry.update(precision=scored.get("precision"), batches=scored.get("batches"), decode=decode)
    if job.status == "done" and scored.get("bleu") is not None:
        entry.update({k: scored.get(k) for k in ("bleu", "signature", "n_sentences", "distinct_hypotheses",
                                                 "bleu_string")})
        wall, n = entry.get("wall_s"), scored.get("n_sentences")
        # start-up included: what one arm costs the BLEU step
        entry["sentences_per_s_overall"] = round(n / wall, 2) if wall and n else None
    else:
        entry["reason"] = (scored.get("reason") or f"BLEU step {job.status}" + (f" ({job.reason})" if job.reason else "")) \
            + f"; see {job.log}"
        _no_bleu(p, entry["reason"], decode)
    return entry


def _summarize_rates(result: dict, cfg: StudyConfig, n_arms: int) -> None:
    """Each arm's measured decode rate (``decode_rates``) and the budget those rates ask for next time."""
    rates = {n: e["decode"] for n, e in result["arms"].items() if (e.get("decode") or {}).get("sentences_per_s")}
    result["decode_rates"] = {n: {k: d.get(k) for k in ("sentences_per_s", "source_tokens_per_s", "startup_s",
                                                       "projected_total_s", "sentences_done", "sentences_total")}
                              for n, d in rates.items()}
    projected = [d["projected_total_s"] for d in rates.values() if d.get("projected_total_s")]
    # what the same step needs next time at the rates measured now: its rounds one after the other
    result["budget_needed_s"] = (round(bleu_rounds(cfg, n_arms) * (max(projected) + BLEU_STOP_GRACE_S), 1)
                                 if projected else None)
