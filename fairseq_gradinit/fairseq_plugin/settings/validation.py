"""Every check of the plugin, in one registry: what each refuses, and when it runs.

A check is a named function that returns what it refuses (a message that says what to do) or None.
:func:`register_check` files it under the point of the run where it runs (``WHEN``):

- ``arguments``: a parsed ``fairseq-train`` namespace, first; the checks of the models and optimizers
  the plugin registers (:func:`check_every_parse`);
- ``settings``: the run's plan as it is resolved: its ``--gradinit-*`` values (refused while they are
  resolved, :func:`given_value_errors`) and the global settings they depend on
  (:func:`~.plan.build_plan` records the first refusal as ``plan.error``);
- ``training setup``: the plan's settings fairseq trips over only after the GradInit phase (the files
  they name), refused when parsed and again by the task before the phase;
- ``legacy task``: the plan of a parsed namespace of a task that declares its options with ``add_args``;
- ``task setup``: the task config, when fairseq sets the task up (before it reads its data);
- ``model``: the freshly built model and the run's plan, before any work;
- ``per-use scales``: the same, once the per-use multipliers of tied embeddings are installed;
- ``resume``: the model, the checkpoint about to be restored and the task;
- ``phase``: the run (:class:`~.run.GradInitRun`) and the model, when the phase starts, on the machine
  that runs it.

At parse time the parser refuses the first message the way it refuses its own arguments
(:func:`check_when_parsed`: ``error: ...``, exit status 2); at run time :func:`require` raises it as
:class:`~..errors.GradInitError`, which the task's entry points end in one line (:mod:`..errors`).

The ``arguments`` checks and the value checks read a parsed namespace or the settings as given
(:func:`~..data.cfg.cfg_value`); every other check reads the run's plan.
"""
from __future__ import annotations

import dataclasses
import enum
import glob
import importlib.util
import math
import os
from typing import Callable, List, Mapping, Optional, Tuple

import torch

from ...command_line.argtypes import parse_betas
from ...core.errors import ConfigError, OptionValueError
from ...core.options import parse_scale_bounds
from ...core.uses import unstepped_uses_error
from ...files.paths import name_too_long
from ..data.binarized import data_bin_error
from ..data.cfg import cfg_value
from ..data.dictionaries import DICTIONARIES_KEY, dictionary_digests, dictionary_mismatch
from ..data.files import unwritable_folder_reason
from ..errors import GradInitError
from ..features.tied import is_multiplier, multiplier_names, uncovered_ties
from .init_file import compute_only_defaults
from .options import GradInitOptions

#: The points of a run where checks run, in order.
WHEN = ("arguments", "settings", "training setup", "legacy task", "task setup", "model", "per-use scales", "resume",
        "phase")


@dataclasses.dataclass(frozen=True)
class Check:
    """One registered check: ``fn(*args) -> message or None``, run at ``when`` (one of ``WHEN``)."""

    name: str
    when: str
    fn: Callable[..., Optional[str]]


_CHECKS: List[Check] = []


def register_check(when: str, name: Optional[str] = None):
    """A decorator filing a check under ``when`` (one of ``WHEN``), after those filed there before;
    registering the same function twice has no effect."""
    if when not in WHEN:
        raise ValueError(f"unknown point {when!r} of a run; expected one of {WHEN}")

    def register(fn):
        if not any(c.fn is fn for c in _CHECKS):
            _CHECKS.append(Check(name or fn.__name__, when, fn))
        return fn

    return register


def check_every_parse(check) -> None:
    """Make every ``fairseq-train`` parser of a task the plugin serves refuse what
    ``check(namespace) -> message or None`` finds, before the ``--gradinit-*`` checks. For the models
    and optimizers the plugin registers: fairseq hands their ``add_args`` an argument group, not the
    parser. Registering the same check twice has no effect."""
    register_check("arguments")(check)


def checks(when: str) -> Tuple[Check, ...]:
    """The checks filed under ``when``, in the order they run."""
    return tuple(c for c in _CHECKS if c.when == when)


def first_error(when: str, *args) -> Optional[str]:
    """The message of the first check under ``when`` that refuses ``args``, or None."""
    for check in checks(when):
        error = check.fn(*args)
        if error:
            return error
    return None


def require(when: str, *args) -> None:
    """Raise :class:`~..errors.GradInitError` with the first refusal under ``when``, if any."""
    error = first_error(when, *args)
    if error is not None:
        raise GradInitError(error)


# -- settings: the --gradinit-* values, as argparse words its errors ---------------------------------
def as_argument_error(error: ValueError, *, eta_from_lr: bool) -> str:
    """A refusal of a ``--gradinit-*`` value as argparse words it: 'argument --flag: ...'. A field of
    :class:`GradInitConfig` (:class:`~fairseq_gradinit.core.errors.ConfigError`) is named by its flag
    (``eta`` by ``--lr`` where eta comes from it); the options' own refusals
    (:class:`~fairseq_gradinit.core.errors.OptionValueError`) name theirs."""
    if isinstance(error, ConfigError) and error.owner == "GradInitConfig":
        flag = "--gradinit-" + error.field.replace("_", "-")
        if error.field == "eta" and eta_from_lr:
            flag = "--lr (the default of --gradinit-eta)"
        return f"argument {flag}: invalid value {error.value!r}: expected {error.expected}"
    if isinstance(error, OptionValueError):
        return f"argument {error.flag}: {error.detail}"
    return str(error)


def monitor_option_error(cfg) -> Optional[str]:
    """'argument --gradinit-monitor-interval: ...' for a value that is not an integer >= 0, else None."""
    value = getattr(cfg, "gradinit_monitor_interval", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return (f"argument --gradinit-monitor-interval: invalid value {value!r}: expected an integer >= 0 "
                "(0 = monitor off)")
    return None


def given_value_errors(given) -> List[str]:
    """The ``--gradinit-*`` values as given (``gradinit_*`` fields) that the run refuses, as
    'argument --flag: ...', in the order they are reported: the monitor's interval, the iterations,
    the tokens, the state's interval, and a clamp without an init file. The engine's refusal and the
    init file's come next (found when the plan resolves them), then :func:`given_combination_errors`."""
    errors = [e for e in (monitor_option_error(given),) if e]
    iters = given.gradinit_iters
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        errors.append(f"argument --gradinit-iters: invalid value {iters!r}: expected an integer >= 0 (0 = GradInit off)")
    max_tokens = given.gradinit_max_tokens
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        errors.append(f"argument --gradinit-max-tokens: invalid value {max_tokens!r}: expected an integer >= 1")
    interval = given.gradinit_checkpoint_interval
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
        errors.append(f"argument --gradinit-checkpoint-interval: invalid value {interval!r}: expected an integer >= 0 "
                      "(0 = never)")
    contrast = getattr(given, "gradinit_source_contrast", 0.0)
    if isinstance(contrast, bool) or not isinstance(contrast, (int, float)) or not 0 <= contrast < math.inf:
        errors.append(f"argument --gradinit-source-contrast: invalid value {contrast!r}: expected a finite number >= 0 "
                      "(0 = off)")
    margin = getattr(given, "gradinit_source_margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
        errors.append(f"argument --gradinit-source-margin: invalid value {margin!r}: expected a finite number of bits "
                      ">= 0 (0 = the linear contrast)")
    elif margin and not (isinstance(contrast, (int, float)) and contrast > 0):
        errors.append("argument --gradinit-source-margin: bounds the source contrast, which is off: add "
                      "--gradinit-source-contrast W (e.g. 10), or leave the margin out")
    if given.gradinit_init_clamp and not given.gradinit_init_file:
        errors.append("argument --gradinit-init-clamp: clamps the scales of --gradinit-init-file, and none is given: "
                      "add --gradinit-init-file PATH, or bound scales that GradInit computes with "
                      "--gradinit-scale-bounds")
    return errors


def given_combination_errors(given) -> List[str]:
    """The refusals of the settings as given that come after the engine's and the init file's: the
    clamp's bounds, and compute-only settings given with an init file (:func:`combination_error`)."""
    errors = []
    clamp = given.gradinit_init_clamp
    if clamp:
        try:
            parse_scale_bounds(clamp, flag="--gradinit-init-clamp")
        except ValueError as e:
            errors.append(as_argument_error(e, eta_from_lr=False))
    combination = combination_error(given, defaults=compute_only_defaults(GradInitOptions))
    return errors + ([combination] if combination else [])


@register_check("settings", "options")
def gradinit_option_error(plan) -> Optional[str]:
    """The first invalid ``--gradinit-*`` value of the run's ``plan`` (:class:`~.plan.RunPlan`) as
    'argument --flag: ...', or None: found while the plan resolved them (``plan.option_errors``).

    The ranges are those of :class:`GradInitConfig`; ``--lr`` is checked as GradInit's eta only when
    GradInit computes (``--gradinit-iters`` > 0).
    """
    return plan.option_errors[0] if plan.option_errors else None


def unsupported_setup_error(cfg) -> Optional[str]:
    """Why GradInit cannot run in the distributed setup of a config (``gradinit_*`` fields), or None."""
    mp = cfg_value(cfg, "gradinit_model_parallel_size", 1)
    return _setup_error(ddp_backend=str(cfg_value(cfg, "gradinit_ddp_backend", "")),
                        model_parallel_size=mp if isinstance(mp, int) else 1,
                        pipeline=cfg_value(cfg, "gradinit_pipeline_model_parallel", False) is True)


def _setup_error(*, ddp_backend: str, model_parallel_size: int, pipeline: bool) -> Optional[str]:
    """Why GradInit cannot run in this distributed setup (and what to do), or None."""
    if ddp_backend == "fully_sharded":
        return ("--ddp-backend fully_sharded is not supported with --gradinit-*: FSDP shards and flattens the "
                "parameters GradInit scales. Use --ddp-backend pytorch_ddp, legacy_ddp or no_c10d, or drop "
                "--gradinit-iters/--gradinit-init-file")
    if model_parallel_size > 1:
        return (f"--model-parallel-size {model_parallel_size} is not supported with --gradinit-*: model parallelism "
                "splits each tensor across ranks and GradInit needs whole tensors. Use --model-parallel-size 1 (data "
                "parallel), or drop --gradinit-iters/--gradinit-init-file")
    if pipeline:
        return ("--pipeline-model-parallel is not supported with --gradinit-*: GradInit needs the whole model on "
                "each rank. Train data parallel (drop --pipeline-model-parallel), or drop "
                "--gradinit-iters/--gradinit-init-file")
    return None


@register_check("settings", "distributed setup")
def distributed_setup_check(plan) -> Optional[str]:
    """The distributed setup, where GradInit runs or applies scales."""
    if not plan.enabled:
        return None
    training = plan.training
    return _setup_error(ddp_backend=training.ddp_backend, model_parallel_size=training.model_parallel_size,
                        pipeline=training.pipeline_model_parallel)


@register_check("settings", "batch tokens")
def batch_tokens_check(plan) -> Optional[str]:
    """Where GradInit computes, a token budget for its batches (split into S and S~); ``--batch-size``
    alone gives none. A budget below the longest sentence is not an error: such sentences are skipped,
    as fairseq-train's own training iterator skips them."""
    if not plan.enabled or plan.init_file or plan.max_tokens is not None:
        return None
    return ("argument --gradinit-max-tokens: GradInit draws batches of a number of tokens and none is set: "
            "pass --max-tokens N (or --gradinit-max-tokens N; --batch-size alone is not enough)")


def combination_error(cfg, *, defaults: Mapping[str, object]) -> Optional[str]:
    """'argument --gradinit-init-file: not allowed with ...' when ``cfg`` sets an init file and
    changes a compute-only setting from its default in ``defaults``; None otherwise."""
    if not getattr(cfg, "gradinit_init_file", None):
        return None
    changed = []
    for name, default in defaults.items():
        value = getattr(cfg, name, default)
        if isinstance(value, enum.Enum):  # fairseq's ChoiceEnum members in configs built by hydra
            value = value.value
        if value != default and (name != "gradinit_iters" or (isinstance(value, int) and value > 0)):
            changed.append(f"--{name.replace('_', '-')} {value}")
    if not changed:
        return None
    return (f"argument --gradinit-init-file: not allowed with {', '.join(changed)}: the file's scales are applied "
            "and GradInit does not run, so these settings would be ignored. Drop them to apply the file, or drop "
            "--gradinit-init-file to compute new scales")



# -- parse time: the parser refuses what a check finds -----------------------------------------------
def check_when_parsed(parser, check) -> None:
    """Make ``parser`` refuse what ``check(namespace) -> message or None`` finds, the way it refuses
    its own arguments: after the parse, ``parser.error`` prints the usage and 'error: ...' and exits
    with status 2. Adding the same check twice has no effect."""
    checks = getattr(parser, "_gradinit_checks", None)
    if checks is None:
        checks = parser._gradinit_checks = []
        parse_known_args = parser.parse_known_args  # parse_args goes through it

        def checked(*args, **kwargs):
            ns, extra = parse_known_args(*args, **kwargs)
            for fn in checks:
                error = fn(ns)
                if error is not None:
                    parser.error(error)
            return ns, extra

        parser.parse_known_args = checked
    if check not in checks:
        checks.append(check)


# -- training setup: what fairseq trips over only after the phase --------------------------------
# Read from the run's plan, so that the same checks refuse a parsed command line (when parsed) and a
# config built without fairseq's parser (fairseq-hydra-train, Python: before the phase, by the task).
#: Optimizers whose --adam-betas/--adam-eps fairseq or torch check only when the optimizer is built.
ADAM_LIKE = ("adam", "radam")


def _optimizer_error(plan) -> Optional[str]:
    optimizer = plan.training.optimizer
    if optimizer not in ADAM_LIKE:
        return None
    betas = plan.training.adam_betas
    if betas is not None:
        try:
            parse_betas(betas)
        except OptionValueError as e:
            return f"argument --adam-betas: {e.reason} (--optimizer {optimizer})"
    eps = plan.training.adam_eps
    if eps is not None and not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0):
        return f"argument --adam-eps: invalid value {eps!r}: expected a number >= 0 (--optimizer {optimizer})"
    return None


#: The file fairseq-train writes into --save-dir (and removes) to check that it can write there, before any work.
VERIFY_FILE = "dummy"


def _saves(plan) -> Optional[str]:
    """The save dir fairseq-train writes into, or None with --no-save."""
    return None if not plan.save_dir or plan.checkpoints.no_save else plan.save_dir


def _save_dir_error(plan) -> Optional[str]:
    save_dir = _saves(plan)
    if save_dir is None:
        return None
    too_long = name_too_long("argument --save-dir", save_dir)
    if too_long:  # fairseq-train's own check of the folder fails on it with an OSError traceback
        return too_long
    reason = unwritable_folder_reason(save_dir)
    if reason and "not a folder" in reason:
        return f"argument --save-dir: {save_dir} {reason}; GradInit's result and the checkpoints go there: give a " \
               "folder you can write"
    if reason and "cannot be written" in reason:
        # fairseq-train's first act is to create the folder and write a file into it, with an OSError traceback
        # where it cannot: the same refusal in one line, whether the folder exists or is still to be created
        return (f"argument --save-dir: {save_dir} {reason}, and fairseq-train writes into it before any work: give a "
                "folder you can write")
    probe = os.path.join(save_dir, VERIFY_FILE)
    if os.path.isdir(save_dir) and os.path.lexists(probe) and not os.path.isfile(probe):
        return (f"argument --save-dir: {probe} is {'a folder' if os.path.isdir(probe) else 'not a regular file'}; "
                "fairseq-train checks that it can write the save folder by writing that file before any work, and "
                "would stop with an OSError: move it away, or give another --save-dir")
    return None


def _train_split_error(plan) -> Optional[str]:
    data, subset = plan.training.data, plan.training.train_subset
    if not data:
        return None
    first = str(data).split(os.pathsep)[0]
    if not os.path.isdir(first):  # the task's setup refuses it, before anything is built
        return None
    pattern = glob.escape(subset) + "*"
    root = glob.escape(first)
    if glob.glob(os.path.join(root, pattern)) or glob.glob(os.path.join(root, "*", pattern)):
        return None
    return (f"argument data: {first} has no '{subset}' split (no file {subset}.* in it or its subfolders); "
            "GradInit and training read it: binarize it with fairseq-preprocess --trainpref, or pass --train-subset")


@register_check("training setup", "optimizer")
def optimizer_check(plan) -> Optional[str]:
    return _optimizer_error(plan) if plan.computes else None


@register_check("training setup", "save dir")
def save_dir_check(plan) -> Optional[str]:
    return _save_dir_error(plan) if plan.computes else None


@register_check("training setup", "train split")
def train_split_check(plan) -> Optional[str]:
    return _train_split_error(plan) if plan.computes else None


def _checkpoint_paths_error(plan) -> Optional[str]:
    """A checkpoint fairseq-train writes into ``--save-dir`` (``checkpoint_last{suffix}.pt``, and
    ``checkpoint_best{suffix}.pt`` where it validates) that exists and is not a file: fairseq treats it
    as no checkpoint to load, trains, and fails at its first save."""
    save_dir = _saves(plan)
    if save_dir is None or not os.path.isdir(save_dir):
        return None
    suffix = plan.checkpoints.suffix
    names = [] if plan.checkpoints.no_last_checkpoints else [f"checkpoint_last{suffix}.pt"]
    if plan.training.validates:
        names.append(f"checkpoint_best{suffix}.pt")
    for name in names:
        path = os.path.join(save_dir, name)
        if os.path.exists(path) and not os.path.isfile(path):
            kind = "a folder" if os.path.isdir(path) else "not a regular file"
            return (f"argument --save-dir: {path} is {kind}; fairseq-train writes its checkpoint there and would "
                    "fail at its first save, after the GradInit phase: move it away, or give another --save-dir")
    return None


def _data_files_error(plan) -> Optional[str]:
    """A truncated or mismatched ``.idx``/``.bin`` pair of a split the run reads (the training split,
    and the validation splits where fairseq-train validates): fairseq fails on it only when a batch
    reaches the missing tokens, or with a traceback when it loads the split."""
    training = plan.training
    if not training.data:
        return None
    train, data = training.train_subset, training.data
    valid = list(training.valid_subsets) if training.validates else []
    shards = [train] + (valid if training.combine_valid_subsets else [])
    error = data_bin_error(str(data), [train] + valid, shards=shards)
    if error is None:
        return None
    return f"argument data: {error}; GradInit and training read it: binarize the split again with fairseq-preprocess"


@register_check("training setup", "checkpoint paths")
def checkpoint_paths_check(plan) -> Optional[str]:
    return _checkpoint_paths_error(plan) if plan.computes else None


@register_check("training setup", "data files")
def data_files_check(plan) -> Optional[str]:
    return _data_files_error(plan) if plan.computes else None


# -- phase: on the machine that runs it, when the phase starts ----------------------------------------
def valid_split_error(task, model, plan) -> Optional[str]:
    """fairseq's refusal of a validation split, which fairseq-train meets at its first validation, after the
    GradInit phase (and a validation split it cannot load): a sample longer than the model and task allow (e.g. a
    long document with ``--sample-break-mode complete_doc``; skipped with ``--skip-invalid-size-inputs-valid-test``),
    one of more tokens than ``--max-tokens-valid`` (default ``--max-tokens``), which fairseq batches without
    skipping, whatever the flag says, or a split of which fairseq makes no batch ("The dataset is empty": no
    samples, all skipped, or fewer than ``--required-batch-size-multiple``, whose last batch fairseq drops). The
    splits are loaded and batched here as fairseq-train loads and batches them next. None with
    ``--disable-validation`` or a ``--validate-after-updates`` beyond ``--max-update`` (all read from the run's
    ``plan``)."""
    training = plan.training
    if not training.validates:
        return None
    skip, max_tokens = training.skip_invalid_valid, training.max_tokens_valid
    from fairseq import utils
    from fairseq.data import data_utils

    subsets = training.valid_subsets
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    for subset in subsets:
        try:
            if subset not in task.datasets:
                task.load_dataset(subset, combine=False, epoch=1)
            dataset = task.datasets[subset]
        except (OSError, KeyError) as e:
            return f"validation split '{subset}' cannot be loaded ({type(e).__name__}: {e}); fix --valid-subset or the data"
        try:
            with data_utils.numpy_seed(plan.seed + 1):  # as fairseq's validation orders them (epoch 1)
                indices = dataset.ordered_indices()
            indices = task.filter_indices_by_size(indices, dataset, max_positions, ignore_invalid_inputs=skip)
        except Exception as e:  # fairseq raises a bare Exception naming the sample
            return f"validation split '{subset}': {e} (found before GradInit)"
        error = over_budget_error(dataset, indices, max_tokens) or no_batch_error(dataset, indices, training)
        if error:
            return f"validation split '{subset}': {error}"
    return None


def no_batch_error(dataset, indices, training) -> Optional[str]:
    """Why fairseq batches none of the samples ``indices`` of the validation split ``dataset`` (after its filter
    by size) as it batches them for validation, or None: fairseq-train then stops at its first validation with
    "The dataset is empty". Read from the plan's ``training`` facts."""
    multiple = training.required_batch_size_multiple
    if len(indices) > 0 and len(dataset.batch_by_size(indices, max_tokens=training.max_tokens_valid,
                                                      max_sentences=training.batch_size_valid,
                                                      required_batch_size_multiple=multiple)) > 0:
        return None
    after = ("; fairseq-train would stop at its first validation, after the GradInit phase ('The dataset is "
             "empty')")
    if len(dataset) == 0:
        return f"it has no samples{after}. Binarize a validation split with sentences, or pass --disable-validation"
    if len(indices) == 0:
        return (f"--skip-invalid-size-inputs-valid-test skips all {len(dataset)} of its samples (each longer than the "
                f"model's positions){after}. Raise the model's positions (e.g. --tokens-per-sample), or pass "
                "--disable-validation")
    return (f"its {len(indices)} samples make no batch: fairseq drops a last batch of fewer than "
            f"--required-batch-size-multiple {multiple} samples{after}. Pass --required-batch-size-multiple 1 "
            f"(any value up to {len(indices)} keeps them), use a larger validation split, or pass --disable-validation")


def over_budget_error(dataset, indices, max_tokens) -> Optional[str]:
    """The first sample of ``dataset`` among ``indices`` with more tokens than ``max_tokens`` (None: no
    limit), which fairseq's ``batch_by_size`` refuses, as a message; or None."""
    if not max_tokens or len(indices) == 0:
        return None
    import numpy as np

    try:
        tokens = np.asarray(dataset.num_tokens_vec(indices), dtype=np.int64)
    except NotImplementedError:
        tokens = np.array([dataset.num_tokens(i) for i in indices], dtype=np.int64)
    over = np.flatnonzero(tokens > int(max_tokens))
    if over.size == 0:
        return None
    first = int(over[0])
    return (f"sample #{int(indices[first])} has {int(tokens[first])} tokens, more than --max-tokens-valid "
            f"{int(max_tokens)} (its default is --max-tokens); fairseq-train would refuse it at its first "
            "validation, after the GradInit phase (--skip-invalid-size-inputs-valid-test skips only samples longer "
            f"than the model's positions). Raise --max-tokens-valid to at least {int(tokens.max())}")


def valid_split_check(run, model) -> Optional[str]:
    """:func:`valid_split_error` as the task found it before handing the run over (the run carries it)."""
    return run.valid_split_error


def precision_error(plan) -> Optional[str]:
    """``--fp16``/``--memory-efficient-fp16`` on a machine without CUDA, or ``--bf16``/
    ``--memory-efficient-bf16`` (which fairseq 0.12.3's parser turns into ``--tpu``) or ``--tpu`` on a
    machine without torch_xla: fairseq-train fails when it builds its trainer or fp16 optimizer, after
    the GradInit phase. Checked when the phase starts, on the machine that runs it (not when parsed: the
    same command line is parsed on other machines too)."""
    import torch

    for flag in ("fp16", "memory_efficient_fp16"):
        if getattr(plan.training, flag) and not torch.cuda.is_available():
            option = "--" + flag.replace("_", "-")
            return (f"{option}: fp16 training needs a CUDA GPU and this machine has none; fairseq-train would fail "
                    f"after the GradInit phase. Drop {option} to train in fp32 here, or run on a GPU")
    if plan.training.tpu and importlib.util.find_spec("torch_xla") is None:
        given = [f for f in ("memory_efficient_bf16", "bf16") if getattr(plan.training, f)]
        if given:
            option = "--" + given[0].replace("_", "-")
            return (f"{option}: fairseq 0.12.3 trains bf16 only on a TPU ({option} turns on --tpu), which needs "
                    "torch_xla, and this machine has none; fairseq-train would fail after the GradInit phase. "
                    f"Drop {option} (--fp16 or --amp train in mixed precision on a GPU)")
        return ("--tpu: training on a TPU needs torch_xla, and this machine has none; fairseq-train would fail after "
                "the GradInit phase. Drop --tpu")
    return None


@register_check("phase", "precision")
def precision_check(run, model) -> Optional[str]:
    return precision_error(run.plan)


register_check("phase", "validation split")(valid_split_check)  # after the precision: as cheap checks go first


# -- model, resume, legacy task ------------------------------------------------------------------
@register_check("model", "unstepped uses")
def unstepped_uses_check(model, plan) -> Optional[str]:
    """``--gradinit-unstepped-uses`` checked against the model's uses once the model exists, before any
    work (when GradInit computes), as the run's ``plan`` says."""
    if not plan.computes:
        return None
    return unstepped_uses_error(model, plan.unstepped_uses, label="--gradinit-unstepped-uses ")


@register_check("per-use scales", "tied embeddings")
def tied_embeddings_check(model, plan) -> Optional[str]:
    """``--gradinit-tied-embeddings per-use`` on a model whose tie gets no per-use scales."""
    if plan.tied_embeddings != "per-use" or not plan.enabled:
        return None
    uncovered = uncovered_ties(model)
    if not uncovered:
        return None
    return (f"--gradinit-tied-embeddings per-use: this model ties {' = '.join(uncovered[0])} (one tensor), "
            "which gets no per-use scales (they exist for fairseq's embed_tokens with embed_scale, as in "
            "the transformer models); use --gradinit-tied-embeddings shared")


def _load(path: str) -> dict:
    try:  # memory-mapped: the keys and the task state are needed, not the tensors
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except (RuntimeError, ValueError):  # not a zip-format checkpoint
        state = torch.load(path, map_location="cpu", weights_only=False)
    return state if isinstance(state, dict) else {}


@register_check("resume", "checkpoint")
def resume_error(model, source: str, task=None) -> Optional[str]:
    """Why the checkpoint ``source`` cannot be restored into ``model`` as built with this command
    line, or None: it was trained with other dictionaries than the data-bin's (``task``'s), or
    ``--gradinit-tied-embeddings per-use`` is given for a checkpoint trained with shared scales
    (its state has no per-use multipliers)."""
    try:
        state = _load(source)
    except Exception as e:  # noqa: BLE001 - empty, truncated or not a checkpoint: one line, not a traceback
        # torch's and pickle's errors carry only their text, and torch's runs on with its C++ frames: its first sentence
        reason = (str(e).strip().splitlines() or [""])[0].split(". ")[0][:200]
        return (f"cannot resume from {source}: it is not a readable checkpoint ({type(e).__name__}: {reason}); it may "
                "be truncated (a run stopped while writing it). Move it away to resume from another checkpoint "
                "(--restore-file) or to start anew")
    if task is not None:
        data = getattr(getattr(task, "gradinit_cfg", None), "data", None) or "the data-bin"
        error = dictionary_mismatch((state.get("task_state") or {}).get(DICTIONARIES_KEY), dictionary_digests(task),
                                    data=str(data))
        if error is not None:
            return f"cannot resume from {source}: {error}"
    if not isinstance(state.get("model"), Mapping):
        return (f"cannot resume from {source}: it holds no model state (no 'model' entry), so it is no checkpoint "
                "of fairseq-train. Move it away to resume from another checkpoint (--restore-file) or to start anew")
    multipliers = multiplier_names(model)
    keys = set(state["model"])
    if multipliers and not any(name in keys for name in multipliers):
        return (f"the checkpoint {source} was trained with shared scales of the tied embeddings (its state has no "
                f"per-use multiplier such as {multipliers[0]}): resume it without --gradinit-tied-embeddings per-use "
                "(the tying of a run is fixed when it starts)")
    mismatch = state_mismatch(model, state["model"])
    if mismatch is None:
        return None
    return (f"cannot resume from {source}: its model state does not fit the model of this command line ({mismatch}); "
            "fairseq-train would refuse it when it loads the checkpoint. Resume with the architecture options it was "
            "trained with, or move it away (or give another --save-dir) to start anew")


def state_mismatch(model, saved: Mapping) -> Optional[str]:
    """How the model state ``saved`` does not fit ``model`` as fairseq loads it (its own upgrade of old
    names, then strictly: every name, every shape), naming the first missing, unexpected or mis-shaped
    entry with the counts; or None. Per-use multipliers the state holds and the model lacks are not
    unexpected: loading installs them. A model that prunes layers when it loads (LayerDrop's
    ``--*-layers-to-keep``) is not compared."""
    config = getattr(model, "cfg", None) or getattr(model, "args", None)
    if any(getattr(config, f"{side}_layers_to_keep", None) for side in ("encoder", "decoder")):
        return None
    saved = dict(saved)
    upgrade = getattr(model, "upgrade_state_dict", None)
    if callable(upgrade):
        try:
            upgrade(saved)
        except Exception as e:  # noqa: BLE001 - fairseq's load runs the same upgrade first, and fails alike
            return f"the model's upgrade of old names fails on it ({type(e).__name__}: {e})"
    own = model.state_dict()
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own and not is_multiplier(k)]
    shaped = [k for k in own if k in saved and hasattr(saved[k], "shape")
              and tuple(saved[k].shape) != tuple(own[k].shape)]
    if not (missing or unexpected or shaped):
        return None
    counts = f"{len(missing)} missing, {len(unexpected)} unexpected, {len(shaped)} of another shape"
    if missing:
        first = f"it lacks {missing[0]}"
    elif shaped:
        k = shaped[0]
        first = f"{k} is {list(saved[k].shape)} in it and {list(own[k].shape)} in this model"
    else:
        first = f"it holds {unexpected[0]}, which this model lacks"
    return f"{first}; {counts}"


@register_check("legacy task", "dataclass config")
def legacy_task_error(plan, task: str = "?") -> Optional[str]:
    """GradInit or its monitor asked of a task whose options are declared with ``add_args``."""
    if plan.enabled or plan.monitor_interval > 0:
        return (f"argument --task: task {task!r} declares its options with "
                "add_args (no dataclass config), which --gradinit-iters/--gradinit-init-file/"
                "--gradinit-monitor-interval does not "
                "support; use a task with a dataclass config (e.g. translation, language_modeling, "
                "masked_lm) or drop the --gradinit-* options")
    return None


# -- settings the phase or fairseq-train trip over before any work ------------------------------------
#: numpy's seeds, which fairseq-train sets from --seed before anything else.
SEED_RANGE = (0, 2**32 - 1)


def _computing_iters(ns) -> int:
    """``--gradinit-iters`` where GradInit computes scales (no init file), else 0."""
    iters = cfg_value(ns, "gradinit_iters", 0)
    if isinstance(iters, bool) or not isinstance(iters, int) or cfg_value(ns, "gradinit_init_file"):
        return 0
    return max(iters, 0)


@register_check("arguments", "activation checkpointing")
def activation_checkpointing_error(ns) -> Optional[str]:
    """--checkpoint-activations/--offload-activations with --gradinit-iters: GradInit differentiates a
    gradient (a second-order pass), which fairseq's activation checkpointing refuses in the first iteration."""
    iters = _computing_iters(ns)
    for flag in ("checkpoint_activations", "offload_activations"):
        if iters and getattr(ns, flag, False) is True:
            return (f"argument --{flag.replace('_', '-')}: not allowed with --gradinit-iters {iters}: GradInit "
                    "differentiates gradients (a second-order pass), which activation checkpointing cannot "
                    "(fairseq: 'Checkpointing is not compatible with .grad()'); compute the scales without it, then "
                    "train with it from them: --gradinit-init-file SAVE_DIR/gradinit.json")
    return None


@register_check("arguments", "data layout")
def data_layout_error(ns) -> Optional[str]:
    """``--dataset-impl raw`` on a binarized data-bin, and ``--share-all-embeddings`` on two different
    dictionaries: fairseq fails on them only after the plugin has loaded (a traceback), or inside the phase."""
    if not _computing_iters(ns):
        return None
    data = str(getattr(ns, "data", "") or "").split(os.pathsep)[0]
    if not data or not os.path.isdir(data):
        return None
    train = getattr(ns, "train_subset", None) or "train"
    if str(getattr(ns, "dataset_impl", None) or "") == "raw" and \
            glob.glob(os.path.join(glob.escape(data), glob.escape(train) + "*.bin")):
        return (f"argument --dataset-impl: raw reads text files, but {data} holds the binarized split '{train}' "
                f"({train}*.bin); drop --dataset-impl raw (fairseq finds the binarized layout itself)")
    src, tgt = getattr(ns, "source_lang", None), getattr(ns, "target_lang", None)
    if getattr(ns, "share_all_embeddings", False) is True and src and tgt:
        paths = [os.path.join(data, f"dict.{lang}.txt") for lang in (src, tgt)]
        if all(os.path.isfile(p) for p in paths):
            with open(paths[0], "rb") as a, open(paths[1], "rb") as b:
                if a.read() != b.read():
                    return (f"argument --share-all-embeddings: {paths[0]} and {paths[1]} are different dictionaries, "
                            "and one embedding matrix cannot serve both; binarize the data with "
                            "fairseq-preprocess --joined-dictionary, or drop --share-all-embeddings")
    return None


@register_check("arguments", "seed")
def seed_error(ns) -> Optional[str]:
    """A --seed numpy refuses (fairseq-train seeds numpy with it first): its traceback, before any work."""
    on = _computing_iters(ns) or cfg_value(ns, "gradinit_init_file")
    seed = getattr(ns, "seed", None) if on else None
    lo, hi = SEED_RANGE
    if isinstance(seed, int) and not isinstance(seed, bool) and not lo <= seed <= hi:
        return (f"argument --seed: invalid value {seed}: expected an integer in [{lo}, {hi}] (fairseq-train seeds "
                "numpy with it, and GradInit draws its batches from it)")
    return None


@register_check("task setup", "data path")
def data_path_check(cfg) -> Optional[str]:
    """A data path that does not exist where GradInit computes: the task's setup would fail reading its
    dictionaries with a traceback once the plugin has loaded. Checked when the task is set up, not when parsed:
    a command line is also parsed where its data is not (study plans, tests)."""
    if not _computing_iters(cfg):
        return None
    data = str(getattr(cfg, "data", "") or "")
    missing = [p for p in data.split(os.pathsep) if p and not os.path.isdir(p)]
    if not missing:
        return None
    what = "is a file, not a folder" if os.path.exists(missing[0]) else "does not exist"
    return (f"argument data: {missing[0]} {what}; give the data-bin folder that fairseq-preprocess wrote "
            "(its --destdir)")
