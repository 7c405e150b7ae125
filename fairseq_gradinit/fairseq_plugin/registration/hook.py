"""GradInit for any fairseq task: a mixin that runs it between building the model and training.

GradInit runs in ``build_criterion``: ``fairseq-train`` calls ``task.build_model`` and then
``task.build_criterion`` before the Trainer casts the model to fp16/bf16 and before the optimizer
copies fp32 master weights, so training starts from exactly the GradInit weights. Inference
entry points build the model with ``from_checkpoint=True`` (and never build the training
criterion with a fresh model), so they never run it; nor does a run that resumes from a
checkpoint. The task takes the run's plan (:class:`~..settings.plan.RunPlan`, resolved once per run, the
parse-time check resolves its own from the namespace) when it first needs it (building the model,
:attr:`GradInitTaskMixin.gradinit_plan`): the cuDNN attention guard, the model checks, the per-use
scales, the monitor, the run log, the batches and the phase read it, none reads the config. The task
builds the run (:class:`~.run.GradInitRun`: data, its training batches a
:class:`~..data.batches.BatchSource` and the validation split checked) and hands it to the phase
(:mod:`..phase.compute`), which never sees the task.
The checks are :mod:`..settings.validation`'s; a refusal ends fairseq-train in one line at the task's entry
points (:func:`~..errors.one_line_exit`).
"""
import logging
import os
from typing import Optional

from ...core import DevicePrefetcher
from ..data.batches import BatchSource, batch_source
from ..data.dictionaries import DICTIONARIES_KEY, dictionary_digests, dictionary_mismatch
from ..data.loss import mean_loss_fn
from ..errors import GradInitError, one_line_exit
from ..features.cpu_threads import choose_cpu_threads
from ..features.monitor import monitor_from_plan
from ..features.sdpa import guard_from_plan
from ..features.tied import install_multipliers, install_multipliers_on_load
from ..features import source_use
from ..features.valid_dropout import dropout_loss_output, reduce_dropout_loss
from ..phase.compute import run_locked
from ..phase.lock import hold_save_dir
from ..phase.provenance import fingerprint, model_arguments
from ..phase.run import GRADINIT_JSON, GradInitRun, rank_world
from ..phase.run_log import progress_from_plan, summarize_at_exit
from ..settings.plan import RunPlan, build_plan, refuse_bad_values_when_parsed
from ..settings.restore import restore_path
from ..settings.validation import require, valid_split_error
from .compat import takes_keyword

logger = logging.getLogger(__name__)


class GradInitTaskMixin:
    """Runs GradInit (``--gradinit-iters N``) or applies saved scales before the first update.

    Put before a fairseq task class in the bases; the task's config must carry the
    :class:`~.options.GradInitOptions` fields.
    """

    @property
    def gradinit_cfg(self):
        """The task config holding the ``--gradinit-*`` fields (legacy-style tasks such as
        ``language_modeling`` keep it in ``args``)."""
        cfg = getattr(self, "cfg", None)
        return cfg if cfg is not None else getattr(self, "args", None)

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        refuse_bad_values_when_parsed(parser)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        # Before the task reads its data: a data path that does not exist is one line, not fairseq's traceback.
        with one_line_exit():
            require("task setup", cfg)
        return super().setup_task(cfg, **kwargs)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._gradinit_plan = None
        self._gradinit_features = None  # (monitor, progress), made from the plan when first needed
        # A freshly built training model and its arguments as given, until its criterion exists.
        self._gradinit_pending = None
        # What build_criterion hands its run (the model's arguments, the criterion's config, the plan it
        # checked and whose save dir it holds), taken by run().
        self._gradinit_context = None
        self.gradinit_sdpa_guard = None  # the cuDNN attention guard's decision, made when the model is built
        self._gradinit_first_valid_loss = None  # the source gap's warning compares each validation with the first
        self._gradinit_no_source_logged = False
        self.gradinit_result = None

    @property
    def gradinit_plan(self) -> RunPlan:
        """The run's settings, resolved once from the task config (:func:`~..settings.plan.build_plan`) when first
        needed: when the model is built, before anything reads a setting."""
        if self._gradinit_plan is None:
            self._gradinit_plan = build_plan(self.gradinit_cfg)
        return self._gradinit_plan

    @property
    def gradinit_monitor(self):
        """The training monitor (``--gradinit-monitor-interval``), None when off."""
        return self._gradinit_side_features()[0]

    @property
    def gradinit_progress(self):
        """The progress lines (``--gradinit-progress-seconds``), None when off or GradInit is off."""
        return self._gradinit_side_features()[1]

    def _gradinit_side_features(self):
        if self._gradinit_features is None:
            plan = self.gradinit_plan
            self._gradinit_features = (monitor_from_plan(plan), progress_from_plan(plan))
        return self._gradinit_features

    def train_step(self, sample, model, criterion, optimizer, update_num, *args, **kwargs):
        ignore_grad = bool(kwargs.get("ignore_grad", args[0] if args else False))
        if self.gradinit_monitor is not None:
            self.gradinit_monitor.on_train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        result = super().train_step(sample, model, criterion, optimizer, update_num, *args, **kwargs)
        if self.gradinit_progress is not None:
            self.gradinit_progress.on_train_step(update_num, result, ignore_grad)
        return result

    def optimizer_step(self, optimizer, model, update_num):
        if self.gradinit_monitor is None:
            return super().optimizer_step(optimizer, model, update_num)
        with self.gradinit_monitor.around_optimizer_step(optimizer, model, update_num):
            return super().optimizer_step(optimizer, model, update_num)

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if self.gradinit_plan.valid_dropout_loss:
            logging_output = dict(logging_output)
            logging_output.update(dropout_loss_output(model, criterion, sample, seed=self.gradinit_plan.seed))
        if self.gradinit_plan.source_gap and sample and "net_input" in sample:
            if source_use.has_source(sample):
                logging_output = dict(logging_output)
                logging_output.update(source_use.rolled_loss_output(model, criterion, sample, loss))
            elif not self._gradinit_no_source_logged:
                self._gradinit_no_source_logged = True
                logger.info("gradinit: source gap: skipped, this task's batches have no source to roll")
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        reduce_dropout_loss(logging_outputs)
        values = source_use.source_gap(logging_outputs)
        if values is not None:
            source_use.log_source_gap(values)

    def post_validate(self, model, stats, agg):
        """After each validation: the source gap's warning, and its record in the monitor's file."""
        parent = getattr(super(), "post_validate", None)
        if parent is not None:
            parent(model, stats, agg)
        gap = stats.get(source_use.GAP_KEY) if isinstance(stats, dict) else None
        if gap is None:
            return
        update, loss = stats.get("num_updates"), stats.get("loss")
        first = self._gradinit_first_valid_loss
        if first is None:
            self._gradinit_first_valid_loss = first = loss
        warns = source_use.gap_warns(float(gap), update, loss=loss, first_loss=first)
        if warns:
            logger.warning("gradinit: WARNING: %s", source_use.warning_text(float(gap), int(update)))
        if self.gradinit_monitor is not None:
            self.gradinit_monitor.write({"type": "validation", "update": update, "loss": stats.get("loss"),
                                         source_use.ROLLED_KEY: stats.get(source_use.ROLLED_KEY),
                                         source_use.GAP_KEY: float(gap), "source_gap_warning": warns})

    def state_dict(self):
        # Saved in every checkpoint's task_state: what the model's word ids mean (see .dictionaries).
        state = dict(super().state_dict() or {})
        state[DICTIONARIES_KEY] = dictionary_digests(self)
        return state

    def load_state_dict(self, state_dict):
        """Refuse a checkpoint trained with other dictionaries than this task's data-bin has."""
        with one_line_exit():  # a GradInitError ends fairseq-train in one line
            state_dict = dict(state_dict or {})
            error = dictionary_mismatch(state_dict.pop(DICTIONARIES_KEY, None), dictionary_digests(self),
                                        data=str(getattr(self.gradinit_cfg, "data", None) or "the data-bin"))
            if error is not None:
                raise GradInitError(error)
            super().load_state_dict(state_dict)

    def build_model(self, cfg, from_checkpoint=False, **kwargs):
        with one_line_exit():  # a GradInitError ends fairseq-train in one line
            # Named in the signature: fairseq's checkpoint loading passes from_checkpoint=True only to a
            # build_model that names it, and a model built for a checkpoint must never get GradInit.
            # Tasks differ in whether they take it; pass it on only to those that do.
            if takes_keyword(super().build_model, "from_checkpoint"):
                kwargs["from_checkpoint"] = from_checkpoint
            from_checkpoint = bool(from_checkpoint)
            plan = self.gradinit_plan
            # The model's arguments as given: building fills in derived ones (e.g. the shared output
            # embedding), and the fingerprint must equal the one of the command line.
            model_args = model_arguments(cfg) if not from_checkpoint and plan.enabled else None
            if not from_checkpoint and self.gradinit_sdpa_guard is None:
                # Before anything runs the model (Admin's profiling, GradInit, training).
                decision = guard_from_plan(plan)
                self.gradinit_sdpa_guard = None if decision is None else decision.to_dict()
                if self.gradinit_monitor is not None:
                    self.gradinit_monitor.sdpa_guard = self.gradinit_sdpa_guard
            model = super().build_model(cfg, **kwargs)
            install_multipliers_on_load(model)
            if not from_checkpoint:  # checked once the model exists, before any work
                require("model", model, plan)
            if plan.tied_embeddings == "per-use":
                # Also when loading a checkpoint: its state holds the multipliers.
                installed = install_multipliers(model)
                if not from_checkpoint:
                    require("per-use scales", model, plan)
                    logger.info("gradinit: per-use scales of tied embeddings: multipliers %s",
                                ", ".join(installed) or "none (the model ties no embedding matrix)")
            # Remember a freshly built training model; GradInit runs once the criterion exists.
            self._gradinit_pending = None if from_checkpoint else (model, model_args)
            return model

    def build_criterion(self, cfg, *args, **kwargs):
        with one_line_exit():  # a GradInitError ends fairseq-train in one line
            from_checkpoint = bool(kwargs.get("from_checkpoint", args[0] if args else False))
            criterion = super().build_criterion(cfg, *args, **kwargs)
            pending, self._gradinit_pending = self._gradinit_pending, None
            if pending is None or from_checkpoint:
                return criterion
            model, model_args = pending
            # The run's settings, resolved when the model was built. The command line was checked when
            # parsed; this also covers configs built otherwise (fairseq-hydra-train, Python). Checked
            # before Admin's profiling and GradInit, so that stopping here costs nothing.
            plan = self.gradinit_plan
            # Which checkpoint fairseq will restore: the save dir as the run starts (fairseq's own refusals
            # of --finetune-from-model combinations raise here, before the save dir is locked).
            source = restore_path(plan.checkpoints)
            self._gradinit_hold(plan)
            if source is not None:
                require("resume", model, source, self)
            else:
                # A model's own preparation before GradInit (transformer_wskip: Admin's profiling).
                prepare = getattr(model, "before_first_update", None)
                if callable(prepare):
                    prepare(self)
            if plan.enabled:
                if source is not None:
                    logger.info("gradinit: a checkpoint will be restored; not running GradInit (fairseq loads %s)",
                                source)
                else:
                    # Before the phase: its passes and the training after it take the threads chosen here.
                    choose_cpu_threads(on_cpu=plan.device().type == "cpu")
                    self._gradinit_context = (model_args, cfg, plan)
                    self.run(plan, model, criterion)
                if rank_world()[0] == 0:  # the scales' file: the init file applied as it is, else the run's own
                    own = os.path.join(plan.save_dir, GRADINIT_JSON)
                    summarize_at_exit(plan.init_file if plan.init_file and not plan.init_clamp else own, plan.save_dir)
            return criterion

    # ------------------------------------------------------------------------------------
    @staticmethod
    def _gradinit_hold(plan: RunPlan) -> None:
        """Refuse a plan with an error, or a training setup fairseq would trip over after the phase; where
        GradInit is on, hold the save dir's lock (:mod:`..phase.lock`) from here until the process ends: a
        second run into the folder stops."""
        if plan.error is not None:
            raise GradInitError(plan.error)
        # Checked when a command line is parsed; a config built otherwise (fairseq-hydra-train, Python)
        # meets them only here, still before any work.
        require("training setup", plan)
        if plan.enabled:
            rank, world = rank_world()
            hold_save_dir(plan.save_dir, rank=rank, world=world)

    def run(self, plan: RunPlan, model, criterion):
        """Run GradInit (or apply ``--gradinit-init-file``) as ``plan`` says on ``model`` in place,
        with batches from this task's training data and the loss of ``criterion``, holding the save
        dir's lock until the process ends. Builds the run (:meth:`gradinit_run`), hands it to the phase
        (:func:`~..phase.compute.run_locked`) and keeps its result in ``gradinit_result``: the
        :class:`~fairseq_gradinit.core.GradInitResult` (None when saved scales were applied)."""
        with one_line_exit():  # a GradInitError ends fairseq-train in one line
            model_args, criterion_cfg, held = self._gradinit_context or (None, None, None)
            self._gradinit_context = None
            if held is not plan:  # build_criterion checked this plan and holds its save dir already
                self._gradinit_hold(plan)
            run = self.gradinit_run(plan, model, criterion, criterion_cfg=criterion_cfg, model_args=model_args)
            self.gradinit_result = run_locked(run, model)
            return self.gradinit_result

    def gradinit_run(self, plan: RunPlan, model, criterion, *, criterion_cfg=None,
                     model_args=None) -> GradInitRun:
        """The :class:`~.run.GradInitRun` of this task under ``plan`` for ``model`` with the loss of
        ``criterion``: everything the phase needs from the task, as data, so that the phase never sees
        it: the training batches (:class:`~..data.batches.BatchSource`) and fairseq's refusal of the
        validation split, found here, before the handover. ``criterion_cfg`` and ``model_args`` (the
        model's arguments as given) enter the fingerprint."""
        rank, world = rank_world()
        current = None
        if rank == 0:  # the fingerprint: model arguments as given on the command line
            current = fingerprint(task_cfg=self.gradinit_cfg, model_cfg=None, criterion_cfg=criterion_cfg,
                                  seed=plan.seed, world_size=world, model_args=model_args, plan=plan)
        batches, batches_error = None, None
        # Batches where the phase draws them: to compute, and for the health check of an init file (rank 0).
        if plan.max_tokens and (plan.computes or (plan.init_file and rank == 0)):
            try:
                batches = self.gradinit_batches(model, plan.max_tokens, plan=plan)
            except Exception as e:  # noqa: BLE001 - the phase reports it where it needs the batches
                if plan.computes and not isinstance(e, ValueError):
                    raise
                batches_error = str(e) if plan.computes else f"{type(e).__name__}: {e}"
        valid_error = valid_split_error(self, model, plan) if plan.computes else None
        return GradInitRun(plan=plan, fingerprint=current, batches=batches, batches_error=batches_error,
                           loss_fn=mean_loss_fn(criterion), criterion=criterion, valid_split_error=valid_error,
                           sdpa_guard=self.gradinit_sdpa_guard)

    def gradinit_batches(self, model, max_tokens: int, *, plan: Optional[RunPlan] = None) -> BatchSource:
        """This task's training batches of ``max_tokens`` tokens for ``model`` under ``plan`` (default:
        :attr:`gradinit_plan`; its seed, ``--batch-size``, training split and ``--gradinit-pairs``), as data."""
        plan = plan or self.gradinit_plan
        authors = plan.config is not None and plan.config.pairs == "authors"
        return batch_source(self, model, max_tokens=max_tokens, subset=plan.training.train_subset,
                            batch_size=plan.training.batch_size, seed=plan.seed, authors=authors,
                            source_contrast=plan.source_contrast, source_margin=plan.source_margin)

    def gradinit_pairs(self, model, max_tokens: int, overlap: float, device, rank: int = 0,
                       world: int = 1, skip: int = 0) -> DevicePrefetcher:
        """Endless (S, S~) pairs on ``device`` of this task's training batches under its plan
        (:meth:`gradinit_batches`, :meth:`~..data.batches.BatchSource.pairs`)."""
        return self.gradinit_batches(model, max_tokens).pairs(overlap, device, rank=rank, world=world, skip=skip)
