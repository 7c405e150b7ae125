"""A run's GradInit settings, resolved once: :class:`RunPlan`.

Every ``--gradinit-*`` option and every global setting the plugin reads (``--lr``, ``--max-tokens``,
``--save-dir``, ``--seed``, ...) is resolved here into typed fields, from the task config of
``fairseq-train`` (whose ``${...}`` interpolations carry the globals, :class:`~.options.PluginOptions`)
or from a parsed ``fairseq-train`` namespace (whose attributes :data:`~.options.GLOBAL_SETTINGS` names,
read off the same interpolations). The task builds its run's plan once, when it first needs it, and
passes it to every check, feature, the fingerprint and the phase; the parse-time check resolves the
namespace it refuses (:func:`namespace_error`), which gives an equal plan.

This module translates fairseq's config into the plan: it is one of the few that read a config itself.
Each option's default is its declaration's (:mod:`.options`); a global setting fairseq's config cannot
resolve (a config built outside ``fairseq-train``) is unknown (None) unless fairseq declares a default
the run would take.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import types
from typing import Any, Mapping, Optional, Tuple

from omegaconf import DictConfig, ListConfig, OmegaConf

from ...core import GradInitConfig
from .init_file import read_init_file
from .option_values import derived_options, gradinit_batch_tokens, gradinit_config_from_task, training_optimizer
from .options import GLOBAL_SETTINGS, RESULT_GLOBAL_SETTINGS, GradInitOptions, fairseq_default, plugin_result_options
from .restore import Checkpointing, checkpointing
from .validation import (
    as_argument_error,
    check_when_parsed,
    first_error,
    given_combination_errors,
    given_value_errors,
)

#: Every field the plugin reads from a task config: the options and the global settings.
SETTING_NAMES = tuple(f.name for f in dataclasses.fields(GradInitOptions) if f.name.startswith("gradinit_"))


@dataclasses.dataclass(frozen=True)
class TrainingFacts:
    """fairseq's own settings of the run that the checks and features read (None: the config does not say)."""

    optimizer: Optional[str]
    #: ``--adam-betas``/``--adam-eps`` as fairseq holds them (checked, not parsed, here).
    adam_betas: Any
    adam_eps: Any
    max_update: Optional[int]
    batch_size: Optional[int]
    data: Optional[str]
    train_subset: str
    valid_subsets: Tuple[str, ...]
    disable_validation: bool
    #: ``--validate-after-updates``: fairseq validates only from that update on.
    validate_after_updates: int
    combine_valid_subsets: bool
    skip_invalid_valid: bool
    #: ``--max-tokens-valid`` (fairseq's default: ``--max-tokens``).
    max_tokens_valid: Optional[int]
    #: ``--batch-size-valid`` (fairseq's default: ``--batch-size``).
    batch_size_valid: Optional[int]
    #: ``--required-batch-size-multiple``: fairseq drops a last batch of fewer sentences.
    required_batch_size_multiple: int
    fp16: bool
    memory_efficient_fp16: bool
    bf16: bool
    memory_efficient_bf16: bool
    amp: bool
    tpu: bool
    cpu: bool
    ddp_backend: str
    model_parallel_size: int
    pipeline_model_parallel: bool

    @property
    def validates(self) -> bool:
        """Whether fairseq-train validates at all: not with ``--disable-validation``, nor when
        ``--validate-after-updates`` lies beyond ``--max-update`` (fairseq validates only at updates >= it)."""
        return not self.disable_validation and not (self.max_update and self.validate_after_updates > self.max_update)


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What one run of the plugin does, resolved once; read by every check, feature, the fingerprint and
    the phase. ``error`` is the first setting the run refuses, worded as argparse words its errors, or None."""

    #: Whether GradInit runs or applies saved scales (``--gradinit-iters`` > 0 or an init file).
    enabled: bool
    #: Whether GradInit computes scales (``--gradinit-iters`` > 0 and no init file).
    computes: bool
    #: ``--gradinit-iters`` (0 where its value is refused: ``error`` says why).
    iters: int
    #: The resolved engine configuration (eta from ``--lr``, gamma from eta, ...), None where it does not
    #: resolve (``config_error`` says why, e.g. GradInit off and ``--lr 0``: nothing to resolve).
    config: Optional[GradInitConfig]
    config_error: Optional[str]
    #: Tokens drawn per GradInit iteration (None: neither ``--gradinit-max-tokens`` nor ``--max-tokens``).
    max_tokens: Optional[int]
    #: The options derived from the training command because they were not given.
    derived: Tuple[str, ...]
    init_file: Optional[str]
    init_clamp: Optional[str]
    #: The ``--gradinit-init-file`` as read (its ``gradinit.json``), None without one or where it cannot be
    #: read (``error`` says why): the phase applies these scales, read once.
    init_record: Optional[Mapping[str, Any]]
    #: GradInit's output folder (``--save-dir``): its result, state, lock and the monitor's file.
    save_dir: str
    seed: int
    #: Iterations between saves of the phase's state (0: never).
    checkpoint_interval: int
    tied_embeddings: str
    #: Updates between the monitor's records (0: off).
    monitor_interval: int
    #: Validation also scored with dropout on.
    valid_dropout_loss: bool
    #: Validation also scored with rolled sources (``--gradinit-source-gap`` auto and on).
    source_gap: bool
    #: The weight of the source contrast in GradInit's objective (``--gradinit-source-contrast``; 0: off).
    source_contrast: float
    #: The gap (bits per token) beyond which the contrast rewards nothing (``--gradinit-source-margin``; 0: linear).
    source_margin: float
    #: Seconds between the training's progress lines (0: off).
    progress_seconds: float
    #: ``--gradinit-cudnn-sdpa-guard`` (None: a config without the option).
    cudnn_sdpa_guard: Optional[str]
    #: ``--gradinit-precision``, the arithmetic of the phase's passes (also where the engine's config does
    #: not resolve: the cuDNN attention guard reads it before the plan's error stops the run).
    phase_precision: str
    #: ``--gradinit-unstepped-uses`` (checked against the model once it exists).
    unstepped_uses: Optional[str]
    training: TrainingFacts
    checkpoints: Checkpointing
    #: The plugin's options and fairseq's settings declared as changing the result, as given (the
    #: fingerprint records them: :func:`~.options.plugin_result_options`, :data:`~.options.RESULT_GLOBAL_SETTINGS`).
    result_settings: Mapping[str, Any]
    #: Every refusal of the option values found while resolving them (the ``settings`` checks report the
    #: first), as argparse words its errors.
    option_errors: Tuple[str, ...] = ()
    error: Optional[str] = None

    def device(self):
        """Where the phase runs: this machine's current GPU unless there is none or ``--cpu``."""
        import torch

        if torch.cuda.is_available() and not self.training.cpu:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def given_settings(source) -> types.SimpleNamespace:
    """Every ``gradinit_*`` field of a task config, or of a parsed ``fairseq-train`` namespace (its
    global settings from the attributes :data:`~.options.GLOBAL_SETTINGS` names), as given: an option
    the source lacks takes its declared default, a global setting it cannot resolve is None."""
    namespace = isinstance(source, argparse.Namespace)
    declared = {f.name: f.default for f in dataclasses.fields(GradInitOptions)}
    out = {}
    for name in SETTING_NAMES:
        absent = None if name in GLOBAL_SETTINGS else declared[name]
        try:
            value = getattr(source, GLOBAL_SETTINGS[name] if namespace and name in GLOBAL_SETTINGS else name)
        except AttributeError:
            value = absent
        except Exception:  # an interpolation omegaconf cannot resolve (a config built outside fairseq)
            value = None
        if isinstance(value, (DictConfig, ListConfig)):  # plain values: the plan holds no live config node
            value = OmegaConf.to_container(value, resolve=True)
        out[name] = None if isinstance(value, str) and value.startswith("${") else value
    # fairseq fills --max-tokens-valid from --max-tokens only after the command line is parsed: the
    # same rule here, so that the parse's plan and the task's are one
    if out["gradinit_max_tokens_valid"] is None:
        out["gradinit_max_tokens_valid"] = out["gradinit_train_max_tokens"]
    if out["gradinit_batch_size_valid"] is None:
        out["gradinit_batch_size_valid"] = out["gradinit_train_batch_size"]
    if not namespace and out["gradinit_train_optimizer"] is None:
        out["gradinit_train_optimizer"] = training_optimizer(source)
    return types.SimpleNamespace(**out)


def build_plan(source) -> RunPlan:
    """The plan of the run a task config or a parsed namespace describes (never raises for bad
    settings: ``plan.error`` says what is wrong): the engine's config derived and the init file read,
    once each. Which checkpoint ``fairseq-train`` will restore is not a setting but a fact of the save
    dir when the run starts: :func:`~.restore.restore_path` of ``plan.checkpoints``."""
    given = given_settings(source)
    iters = given.gradinit_iters if _count(given.gradinit_iters) else 0
    init_file = given.gradinit_init_file or None
    errors = given_value_errors(given)
    try:
        config, config_error = gradinit_config_from_task(given), None
    except ValueError as e:
        config, config_error, refusal = None, str(e), e
        if iters == 0:  # --lr matters only when GradInit computes
            try:
                gradinit_config_from_task(given, lr_matters=False)
                refusal = None
            except ValueError as other:
                refusal = other
        if refusal is not None:
            errors.append(as_argument_error(refusal, eta_from_lr=given.gradinit_eta is None))
    init_record = None
    if init_file:
        try:
            init_record = types.MappingProxyType(read_init_file(init_file))
        except ValueError as e:
            errors.append(as_argument_error(e, eta_from_lr=False))
    errors += given_combination_errors(given)
    plan = RunPlan(
        enabled=iters > 0 or bool(init_file), computes=iters > 0 and not init_file, iters=iters,
        config=config, config_error=config_error, max_tokens=gradinit_batch_tokens(given),
        derived=tuple(derived_options(given)), init_file=init_file, init_clamp=given.gradinit_init_clamp or None,
        init_record=init_record, save_dir=str(_known(given, "gradinit_save_dir")),
        seed=int(_known(given, "gradinit_seed")),
        checkpoint_interval=given.gradinit_checkpoint_interval if _count(given.gradinit_checkpoint_interval) else 0,
        tied_embeddings=str(_text(given.gradinit_tied_embeddings)),
        monitor_interval=given.gradinit_monitor_interval if _count(given.gradinit_monitor_interval) else 0,
        valid_dropout_loss=given.gradinit_valid_dropout_loss is True,
        source_gap=_text(given.gradinit_source_gap) != "off",
        source_contrast=_weight(given.gradinit_source_contrast),
        source_margin=_weight(given.gradinit_source_margin),
        progress_seconds=float(given.gradinit_progress_seconds or 0),
        cudnn_sdpa_guard=None if given.gradinit_cudnn_sdpa_guard is None else str(_text(given.gradinit_cudnn_sdpa_guard)),
        phase_precision=str(_text(given.gradinit_precision)), unstepped_uses=given.gradinit_unstepped_uses,
        training=_training_facts(given), checkpoints=checkpointing(given),
        result_settings=types.MappingProxyType({name: getattr(given, name) for name in
                                                plugin_result_options() + RESULT_GLOBAL_SETTINGS}),
        option_errors=tuple(errors))
    return dataclasses.replace(plan, error=first_error("settings", plan))


def _training_facts(given) -> TrainingFacts:
    max_update = given.gradinit_train_max_update
    mp = given.gradinit_model_parallel_size
    betas = given.gradinit_adam_betas
    return TrainingFacts(
        # a config holds the betas as a list, a parsed namespace as a tuple: one plan from both
        optimizer=given.gradinit_train_optimizer, adam_betas=tuple(betas) if isinstance(betas, list) else betas,
        adam_eps=given.gradinit_adam_eps,
        max_update=max_update if isinstance(max_update, int) and not isinstance(max_update, bool) else None,
        batch_size=given.gradinit_train_batch_size, data=given.gradinit_data,
        train_subset=str(_known(given, "gradinit_train_subset")),
        valid_subsets=tuple(s for s in str(given.gradinit_valid_subset or "").split(",") if s),
        disable_validation=given.gradinit_disable_validation is True,
        validate_after_updates=_positive(given.gradinit_validate_after_updates) or 0,
        combine_valid_subsets=given.gradinit_combine_valid_subsets is True,
        skip_invalid_valid=given.gradinit_skip_invalid_valid is True,
        max_tokens_valid=given.gradinit_max_tokens_valid,
        batch_size_valid=_positive(given.gradinit_batch_size_valid),
        required_batch_size_multiple=_positive(given.gradinit_required_batch_size_multiple) or 1,
        fp16=given.gradinit_fp16 is True, memory_efficient_fp16=given.gradinit_memory_efficient_fp16 is True,
        bf16=given.gradinit_bf16 is True, memory_efficient_bf16=given.gradinit_memory_efficient_bf16 is True,
        amp=given.gradinit_amp is True, tpu=given.gradinit_tpu is True, cpu=bool(given.gradinit_cpu),
        ddp_backend=str(_text(given.gradinit_ddp_backend) or ""),
        model_parallel_size=mp if isinstance(mp, int) and not isinstance(mp, bool) else 1,
        pipeline_model_parallel=given.gradinit_pipeline_model_parallel is True,
    )


def _positive(value) -> Optional[int]:
    """An integer setting above 0 as given, else None (fairseq's 'no limit')."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _count(value) -> bool:
    """Whether ``value`` is an integer >= 0 (a count or an interval)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _weight(value) -> float:
    """A non-negative float option as a number; anything else (refused by the value checks) as 0."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0.0


def _text(value):
    """A choice as its text (hydra hands fairseq's ChoiceEnum members)."""
    return value.value if isinstance(value, enum.Enum) else value


def _known(given, name: str):
    """A global setting, or fairseq's default for it where the config cannot resolve it."""
    value = getattr(given, name)
    return fairseq_default(name) if value is None else value


def namespace_error(ns) -> Optional[str]:
    """What the parser refuses in a parsed ``fairseq-train`` namespace's plan: the ``--gradinit-*``
    options and the settings GradInit cannot run with (:attr:`RunPlan.error`), then the training
    setup fairseq would trip over after the phase (the ``training setup`` checks, which the task runs
    again before the phase for configs not parsed from a command line), or None."""
    if not hasattr(ns, "gradinit_iters"):
        return None
    plan = build_plan(ns)
    return plan.error or first_error("training setup", plan)


def parse_error(ns) -> Optional[str]:
    """What the parser of a task the plugin serves refuses in a parsed namespace, or None: the
    checks of :mod:`.validation` in their order, ``arguments`` (the plugin's models and optimizers,
    :func:`~.validation.check_every_parse`), then ``settings`` and ``training setup``
    (:func:`namespace_error`)."""
    return first_error("arguments", ns) or namespace_error(ns)


def legacy_task_parse_error(ns) -> Optional[str]:
    """What the parser of a task that declares its options with ``add_args`` refuses: the ``legacy
    task`` checks of the namespace's plan."""
    if not hasattr(ns, "gradinit_iters"):
        return None
    return first_error("legacy task", build_plan(ns), str(getattr(ns, "task", "?")))


def refuse_bad_values_when_parsed(parser) -> None:
    """Make ``parser`` refuse what :func:`parse_error` finds the way it refuses its own arguments
    (the ranges depend on each other and on --lr, so they are checked after the parse)."""
    check_when_parsed(parser, parse_error)
