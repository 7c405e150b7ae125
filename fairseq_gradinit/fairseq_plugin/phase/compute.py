"""The GradInit phase of a fairseq run: what the task does with a :class:`~.run.GradInitRun`
(the run's plan, fingerprint, batches and loss, built by :class:`~..registration.hook.GradInitTaskMixin`) and a
freshly built fp32 model. The phase never sees the task: it reads the run and returns its result.

Batches come from the run's batch source (:class:`~..data.batches.BatchSource`: the task's own
training iterator, as data) and the loss from the
user's criterion, so the same code serves translation, language modeling and the other tasks. An
existing ``gradinit.json`` is never overwritten, the phase's state is checkpointed into the save dir
and resumed, and a stop (SIGINT/SIGTERM) says what was kept.
"""
import dataclasses
import json
import logging
import os
import signal
import time
from typing import Mapping, Optional

import numpy as np
import torch
import torch.distributed as dist

from ...command_line.argtypes import parse_betas
from ...core import apply_scales, gradinit, summarize_scales
from ...core.errors import OptionValueError, flag_name
from ...core.health import snapshot_weights
from ...core.scales import scales_error
from ..data.files import atomic_write_json, remove_stale_temp_files, write_result
from ..errors import GradInitError
from ..features.groups import transformer_group
from ..features.health import measure_health, nonfinite_blocks
from ..features.tied import (
    apply_multiplier_scales,
    effective_use_scales,
    is_multiplier,
    multiplier_names,
    multipliers_as_parameters,
)
from ..settings.init_file import (
    clamp_target_error,
    clamped_init_file,
    read_init_file,
    saved_gamma,
    source_fingerprint,
    unscaled_tensors,
)
from ..settings.plan import RunPlan
from ..settings.validation import first_error
from .provenance import COMPARED_KEYS, INIT_FILE_KEYS, fingerprint_diff
from .run import GRADINIT_JSON, GradInitRun, rank_world
from .signals import sigterm_raises_interrupt
from .state import load_phase_state, save_phase_state

logger = logging.getLogger("fairseq_gradinit.fairseq_plugin.registration.hook")  # one logger for the task's GradInit lines

__all__ = ["GRADINIT_JSON", "apply_saved", "compute", "log_summary", "run_locked", "saved_result_decision"]


def saved_result_decision(path: str, current: dict) -> tuple:
    """('run', None), ('reuse', None) or ('stop', message) for an existing ``gradinit.json``."""
    return _saved_result(path, current)[:2]


def _saved_result(path: str, current: dict) -> tuple:
    """:func:`saved_result_decision` and the ``gradinit.json`` it read (None unless it is reused)."""
    if not os.path.exists(path):
        return ("run", None, None)
    advice = (f"GradInit never overwrites it: use another --save-dir, delete {path} to compute it again, or "
              f"pass --gradinit-init-file {path} to apply its scales")
    try:
        saved = read_init_file(path)
    except ValueError as e:  # the check every file of scales gets: it cannot be applied either
        reason = e.reason if isinstance(e, OptionValueError) else str(e)
        return ("stop", f"{path} exists but is not a usable GradInit result ({reason}). GradInit "
                f"never overwrites it: use another --save-dir, or delete {path} to compute it again", None)
    clamped = saved.get("clamped_from")
    if clamped:  # computed by no GradInit run, whatever fingerprint it carries
        return ("stop", f"{path} exists and holds scales clamped by --gradinit-init-clamp from "
                        f"{clamped.get('path') if isinstance(clamped, dict) else clamped}, which no GradInit run of "
                        f"this command computed. {advice}", None)
    diff = fingerprint_diff(saved.get("fingerprint"), current, keys=COMPARED_KEYS)
    if diff:
        return ("stop", f"{path} exists and was written by a different run ({'; '.join(diff)}). {advice}", None)
    if saved["fingerprint"].get("version") != current.get("version"):
        logger.info("gradinit: %s was written by fairseq_gradinit %s (this is %s)", path,
                    saved["fingerprint"].get("version"), current.get("version"))
    return ("reuse", None, saved)


def run_locked(run: GradInitRun, model):
    """The phase, the save dir's lock held: apply the init file, reuse this run's ``gradinit.json``
    or compute the scales (:func:`compute`). Returns the
    :class:`~fairseq_gradinit.core.GradInitResult` (None when saved scales were applied)."""
    rank, world = rank_world()
    plan, path, current = run.plan, run.result_path, run.fingerprint
    if plan.init_file:  # read when the plan was resolved
        return apply_saved(run, model, plan.init_file, current, INIT_FILE_KEYS, "--gradinit-init-file", measure=True,
                           saved=plan.init_record)

    # An existing gradinit.json is never overwritten: the same run reuses it, another stops.
    # Rank 0 decides for all ranks, so they cannot split between computing and reusing.
    decision, message, saved = _saved_result(path, current) if rank == 0 else (None, None, None)
    decision = (decision, message)
    if world > 1:
        box = [decision]
        dist.broadcast_object_list(box, src=0)
        decision = box[0]
    if decision[0] == "stop":
        raise GradInitError(decision[1])
    if decision[0] == "reuse":
        logger.info("gradinit: %s exists and its fingerprint matches this run (model, criterion, seed, data, "
                    "world size, GradInit settings); applying its scales instead of running GradInit", path)
        return apply_saved(run, model, path, None, (), "reused", saved=saved)
    return compute(run, model)


def _log_plan(plan: RunPlan, device, rank: int, world: int) -> None:
    gcfg = plan.config
    logger.info(
        "gradinit: %d iterations on %s, optimizer=%s eta=%g gamma=%s tau=%g, objective after %d simulated step%s, "
        "%d tokens per iteration (S and S~ share %.0f%%, pairs %s), rank %d/%d", gcfg.iters, device, gcfg.optimizer,
        gcfg.eta, f"{gcfg.resolved_gamma:g}" if gcfg.resolved_gamma is not None else
        f"{gcfg.gamma_init_factor:g} x ||g|| at the init", gcfg.lr, gcfg.lookahead_steps,
        "s" if gcfg.lookahead_steps > 1 else "", plan.max_tokens, 100 * gcfg.overlap, gcfg.pairs, rank, world)
    note = simulated_betas_note(plan, gcfg)
    if note:
        logger.warning("gradinit: WARNING: %s", note)
    settings = {k: v for k, v in gcfg.to_dict().items() if k != "param_filter"}
    logger.debug("gradinit: settings (%s derived from the training command): %s",
                ", ".join(plan.derived) or "none", json.dumps(settings, default=str))


def simulated_betas_note(plan: RunPlan, gcfg) -> Optional[str]:
    """Which Adam betas the objective's simulated training steps use, and why, where they are not the
    training's ``--adam-betas`` (None where they are, or where no Adam step is simulated): eta and the
    optimizer come from the training command, the simulated steps' betas from --gradinit-lookahead-betas."""
    if gcfg.optimizer != "adam" or gcfg.lookahead_steps <= 1 or plan.training.optimizer not in ("adam", "radam"):
        return None
    given = plan.training.adam_betas if plan.training.adam_betas is not None else "(0.9, 0.999)"
    try:
        train = parse_betas(given) if isinstance(given, str) else tuple(float(b) for b in given)
    except (ValueError, TypeError):
        return None
    simulated = tuple(float(b) for b in gcfg.lookahead_betas)
    if train == simulated:
        return None
    return (f"the objective simulates {gcfg.lookahead_steps} Adam steps with betas {simulated}, training uses "
            f"{train}: --gradinit-lookahead-betas '{train}' simulates its steps")


def _write(path: str, out: dict, resume_path: str) -> None:
    error = scales_error(out["scales"])  # the engine refuses them first; a file of them is never written
    if error:
        raise GradInitError(f"GradInit's result has {error}; {path} was not written and training did not start")
    lost = write_result(path, out)
    if lost:  # disk full, permissions: say where the result is instead of a traceback
        raise GradInitError(lost)
    logger.info("gradinit: wrote %s", path)
    if os.path.exists(resume_path):
        os.unlink(resume_path)


def _stopped(e: KeyboardInterrupt, done: str, path: str, resume_path: str, saved_at: int) -> SystemExit:
    """Log what a SIGINT/SIGTERM during the phase left, and the exit to raise (128 + signal)."""
    signum = getattr(e, "signum", signal.SIGINT)
    again = (f"Run the same command again to resume GradInit after iteration {saved_at} (saved in "
             f"{resume_path})." if saved_at else "Run the same command again to start GradInit from the beginning.")
    logger.error("gradinit: stopped by %s during %s; %s was not written and training did not start. %s",
                 signal.Signals(signum).name, done, path, again)
    return SystemExit(128 + signum)


class _DrawnPairs:
    """The phase's pairs as it draws them: ``drawn`` counts them (resumed iterations included), ``last``
    is the latest, on which the health check measures."""

    def __init__(self, source, drawn: int):
        self.source, self.drawn, self.last = source, drawn, None

    def __iter__(self):
        return self

    def __next__(self):
        pair = next(self.source)
        self.drawn += 1
        self.last = pair
        return pair


class _StateSaves:
    """Saves the phase's state (rank 0) when the engine hands it over, and knows the iteration of the
    last save: an interrupted phase says where it will resume."""

    def __init__(self, path: str, current: Optional[dict], rank: int, saved_at: int):
        self.path, self.current, self.rank, self.saved_at, self.failed = path, current, rank, saved_at, []

    def __call__(self, state) -> None:
        if self.rank == 0 and not _saved_phase_state(self.path, state, self.current, self.failed):
            return
        self.saved_at = len(state["history"])


def _scales(model, pairs: _DrawnPairs, run: GradInitRun, gcfg, *, resume, resume_path: str, checkpoint,
            interval: int, initial, measure: bool) -> tuple:
    """(GradInit's result, the health of its scales or None unless ``measure``), with per-use
    multipliers of tied embeddings scaled as parameters that training does not update."""
    multipliers = multiplier_names(model)
    if multipliers:
        gcfg = dataclasses.replace(gcfg, fixed_params=is_multiplier)
    with multipliers_as_parameters(model, multipliers):
        try:
            result = gradinit(model, pairs, run.loss_fn, gcfg, state=resume, checkpoint=checkpoint,
                              checkpoint_interval=interval, option_name=flag_name)
        except ValueError as e:
            if resume is None:
                raise
            raise GradInitError(f"{resume_path}: {e}; delete it to start GradInit anew") from None
        health = measure_health(model, result.scales, run.criterion, getattr(pairs.last, "s", None),
                                initial=initial, config=gcfg, loss_fn=run.loss_fn, history=result.history,
                                gamma=result.gamma) if measure else None
        pairs.last = None
    return result, health


def _computable(plan: RunPlan, model):
    """The plan's GradInitConfig, after checking that it can compute on ``model``."""
    if plan.config is None:  # a plan built by hand: build_plan sets its error
        raise GradInitError(plan.config_error)
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"GradInit expects the freshly built fp32 model, got {dtype}")
    if not plan.max_tokens:
        raise ValueError("set --gradinit-max-tokens (or --max-tokens) for GradInit's batches")
    return plan.config


def compute(run: GradInitRun, model):
    """Compute the scales on this rank's batches, apply them, write the run's gradinit.json (rank 0)
    and return the :class:`~fairseq_gradinit.core.GradInitResult`."""
    rank, world = rank_world()
    plan, current, path = run.plan, run.fingerprint, run.result_path
    save_dir, gcfg, max_tokens = plan.save_dir, _computable(plan, model), plan.max_tokens
    device = plan.device()
    use_cuda = device.type == "cuda"
    orig_device = next(model.parameters()).device
    _log_plan(plan, device, rank, world)

    if rank == 0:
        for tmp in remove_stale_temp_files(save_dir, GRADINIT_JSON):
            logger.info("gradinit: removed %s, left by an interrupted run", tmp)
    # The health check compares the weights before the scales with those after, on the last pair.
    initial = snapshot_weights(model) if rank == 0 else None
    model.to(device)
    resume, resume_path = _phase_state(run.state_path, current, rank, world)
    done_before = 0 if resume is None else len(resume["history"])
    error = run.batches_error
    if error is None:
        try:
            source = run.batches.pairs(gcfg.overlap, device, rank=rank, world=world, skip=done_before)
        except ValueError as e:
            error = str(e)
    if error is not None:
        model.to(orig_device)
        raise GradInitError(f"GradInit's batches: {error}")
    pairs = _DrawnPairs(source, done_before)
    # fairseq would refuse them after the phase
    error = first_error("phase", run, model)
    if error is not None:
        source.close()
        model.to(orig_device)
        raise GradInitError(error)
    interval = plan.checkpoint_interval
    saves = _StateSaves(resume_path, current, rank, done_before)
    start, result = time.time(), None
    with sigterm_raises_interrupt():
        try:
            try:
                result, health = _scales(model, pairs, run, gcfg, resume=resume, resume_path=resume_path,
                                         checkpoint=saves if interval else None, interval=interval,
                                         initial=initial, measure=rank == 0)
                initial = None  # free the copy before training
            except FloatingPointError as e:  # non-finite losses: the model is left as built
                raise GradInitError(f"{e} {path} was not written and training did not start.") from None
            finally:
                source.close()
                model.to(orig_device)
                if use_cuda:
                    torch.cuda.empty_cache()
            _refuse_nonfinite_final_scales(health, path, rank, world)
            summary = log_summary(result.scales)
            if rank == 0:
                out = result.to_dict()
                out.update(summary=summary, uses=effective_use_scales(model, result.scales),
                           max_tokens=max_tokens, derived=list(plan.derived), device=str(device),
                           wall_time_total=time.time() - start, fingerprint=current, health=health,
                           cudnn_sdpa_guard=run.sdpa_guard)
                _write(path, out, resume_path)
        except KeyboardInterrupt as e:
            done = "the GradInit result" if result is not None else \
                f"iteration {pairs.drawn} of {gcfg.iters}"
            raise _stopped(e, done, path, resume_path, saves.saved_at) from None
    return result


def _refuse_nonfinite_final_scales(health: Optional[dict], path: str, rank: int, world: int) -> None:
    """Stop (every rank: rank 0 measured and decides) when the gradient at the final scales is not finite on
    the last GradInit batch: these scales would be written and applied, then training would die at its first
    update in fairseq's "gradients are Nan/Inf" traceback."""
    box = [None]
    blocks = nonfinite_blocks(health) if rank == 0 else []
    if blocks:
        box = [f"GradInit: the loss gradient at the final scales is not finite on the last GradInit batch (in "
               f"{len(blocks)} blocks, e.g. {blocks[:3]}), so training would stop at its first update with NaN/Inf "
               f"gradients; {path} was not written and training did not start. Lower --gradinit-lr, or set "
               "--gradinit-max-scale"]
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise GradInitError(box[0])


def _saved_phase_state(path: str, state: dict, current: Optional[dict], failed: list) -> bool:
    """Save the phase state at ``path``; a write error (disk full, permissions) is logged once
    (noted in ``failed``) and the phase goes on, since the state only serves a stopped phase."""
    try:
        save_phase_state(path, state, current)
        return True
    except (OSError, RuntimeError) as e:  # torch.save reports some write errors as RuntimeError
        if not failed:
            failed.append(e)
            logger.warning("gradinit: WARNING: could not save the GradInit phase state %s (%s) after iteration %d; "
                           "GradInit goes on, but a stop now can resume only from an earlier saved state. Free "
                           "space (or fix the permissions); this warning is not repeated", path,
                           e.strerror or e, len(state["history"]))
        return False


def _phase_state(path: str, current: Optional[dict], rank: int, world: int):
    """(the saved phase state at ``path`` to resume or None, ``path``); rank 0 reads it for all ranks."""
    box = [None]
    if rank == 0:
        try:
            box = [("ok", load_phase_state(path, current, lambda a, b: fingerprint_diff(a, b, keys=COMPARED_KEYS)))]
        except ValueError as e:
            box = [("stop", str(e))]
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "stop":
        raise GradInitError(value)
    if value is not None:
        logger.info("gradinit: resuming the GradInit phase from %s after iteration %d", path, len(value["history"]))
    return value, path

def apply_saved(run: GradInitRun, model, path: str, current: Optional[dict], keys, source: str, *,
                measure: bool = False, saved: Optional[Mapping] = None):
    """Apply the scales saved at ``path`` (``saved``: the file as read already, else read here) after
    checking they name this model's tensors; with ``measure``, rank 0 measures their health on one
    GradInit batch of the run."""
    plan = run.plan
    if saved is None:
        try:
            saved = read_init_file(path, flag=source)
        except ValueError as e:
            raise GradInitError(str(e)) from None
    scales = saved["scales"]
    multipliers = [n for n in scales if is_multiplier(n)]
    if multipliers and not multiplier_names(model):
        raise GradInitError(f"{source} {path}: it holds per-use scales of tied embeddings ({', '.join(multipliers)}); "
                           "pass --gradinit-tied-embeddings per-use to apply it")
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    known = set(names) | set(multiplier_names(model))
    missing = [n for n in scales if n not in known]
    if missing:
        raise GradInitError(
            f"{source} {path}: {len(missing)} of its {len(scales)} scales name tensors this model does not "
            f"have, e.g. {missing[:5]} (the model has e.g. {names[:3]}); it was computed for another "
            "architecture")
    unscaled = unscaled_tensors(model, scales, saved.get("config"))
    if unscaled:
        raise GradInitError(
            f"{source} {path}: no scale for {len(unscaled)} of this model's tensors, e.g. {unscaled[:5]}: they "
            "would start unscaled while the others are scaled (was the file edited?); recompute it, or restore "
            "the missing scales")
    if current is not None and keys:
        diff = fingerprint_diff(source_fingerprint(saved), current, keys=keys)
        if diff:
            logger.warning(
                "gradinit: WARNING: %s %s was computed for a different model, seed or data than this run (%s). "
                "Its scales fit the initial weights of that run; applying them anyway.", source, path,
                "; ".join(diff))
    clamp = plan.init_clamp if source == "--gradinit-init-file" else None
    record = _clamp_saved(model, path, saved, clamp) if clamp else None
    if record is not None:
        _check_clamp_target(run.result_path, record)
        scales = record["scales"]
    measured = measure and rank_world()[0] == 0
    initial = snapshot_weights(model) if measured else None
    apply_scales(model, apply_multiplier_scales(model, scales))
    logger.info("gradinit: applied %d scales from %s%s", len(scales), path, " (clamped)" if clamp else "")
    # Drawing and measuring must leave the random state as it was: training from the file must be
    # the training of the run that computed it.
    np_state = np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        sample = _health_batch(run, model) if measured else None
        health = measure_health(model, scales, run.criterion, sample,
                                initial=initial if sample is not None else None,
                                config=saved.get("config"), loss_fn=run.loss_fn,
                                history=saved.get("history"), gamma=saved_gamma(saved))
    np.random.set_state(np_state)
    del initial, sample
    if record is not None:
        record["health"] = health
        _write_clamped(run.result_path, record)
    log_summary(scales)
    return None

def _health_batch(run: GradInitRun, model):
    """The S batch of GradInit's first iteration for this run, on the model's device, or None (logged)
    where it cannot be drawn: the health check then judges the scales alone."""
    plan = run.plan
    if run.batches is None:
        if run.batches_error is not None:
            logger.info("gradinit: no batch for the health check (%s); judging the scales alone", run.batches_error)
        return None
    device = next(model.parameters()).device
    overlap = plan.config.overlap if plan.config is not None else 0.5
    try:
        pairs = run.batches.pairs(overlap, device)
        try:
            return next(iter(pairs)).s
        finally:
            pairs.close()
    except Exception as e:  # noqa: BLE001 - the check must never stop a run that applies a file
        logger.info("gradinit: no batch for the health check (%s: %s); judging the scales alone",
                    type(e).__name__, e)
        return None


def _clamp_saved(model, path: str, saved: dict, clamp: str) -> dict:
    """The init file as a record of its own with the scales clamped by ``--gradinit-init-clamp``
    (logged); :meth:`_write_clamped` stores it in ``--save-dir``'s gradinit.json (never
    overwritten: an existing one is left as it is)."""
    try:
        record = clamped_init_file(model, path, saved, clamp)
    except ValueError as e:
        raise GradInitError(str(e)) from None
    changed = record["clamped_from"]["changed"]
    logger.info("gradinit: --gradinit-init-clamp changed %d of %d scales%s", len(changed), len(record["scales"]),
                "".join(f"\n  {n}: {a:.4g} -> {b:.4g}" for n, (a, b) in list(changed.items())[:40]))
    return record

def _check_clamp_target(out: str, record: dict) -> None:
    """Stop before the scales are applied when ``--save-dir``'s gradinit.json holds other scales than
    the clamped ``record`` (rank 0 decides for all ranks)."""
    rank, world = rank_world()
    box = [None]
    if rank == 0 and os.path.exists(out):
        try:
            with open(out, encoding="utf-8") as f:
                existing = json.load(f)
        except (OSError, ValueError):
            existing = None
        box = [clamp_target_error(existing if isinstance(existing, dict) else {}, record, out)]
    if world > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise GradInitError(box[0])


def _write_clamped(out: str, record: dict) -> None:
    rank, _ = rank_world()
    if rank == 0:
        if os.path.exists(out):  # the same clamped scales (checked before they were applied)
            logger.info("gradinit: %s already holds these clamped scales; left as it is", out)
        else:
            atomic_write_json(out, record)
            logger.info("gradinit: wrote the clamped scales to %s", out)

def log_summary(scales):
    """The scales by group (count, min, mean, max): in gradinit.json, and logged at the debug level."""
    summary = summarize_scales(scales, transformer_group)
    logger.debug("gradinit: scales by group (count min/mean/max)")
    for group, s in summary.items():
        logger.debug("gradinit:   %-32s %3d  %.4f / %.4f / %.4f", group, s["count"], s["min"], s["mean"], s["max"])
    return summary
