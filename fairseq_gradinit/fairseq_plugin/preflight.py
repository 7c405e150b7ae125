"""Training settings that fairseq only trips over after the GradInit phase, checked when parsed.

fairseq builds the optimizer, reads the train split and writes into ``--save-dir`` after the task's
``build_criterion``, where GradInit runs: a typo there would cost the whole phase (minutes for 780
iterations). When GradInit computes (``--gradinit-iters`` > 0), the parser refuses these settings
first, with one ``error:`` line, before anything is built. Only settings that are wrong on every
machine are checked here (the same command line is also parsed where it does not run).
"""
from __future__ import annotations

import glob
import os
from typing import Optional

from ..argtypes import parse_betas
from .files import unwritable_folder_reason

#: Optimizers whose --adam-betas/--adam-eps fairseq or torch check only when the optimizer is built.
ADAM_LIKE = ("adam", "radam")


def _optimizer_error(ns) -> Optional[str]:
    optimizer = getattr(ns, "optimizer", None)
    if optimizer not in ADAM_LIKE:
        return None
    betas = getattr(ns, "adam_betas", None)
    if betas is not None:
        try:
            parse_betas(betas)
        except ValueError as e:
            return f"argument --adam-betas: {str(e).split(': ', 1)[-1]} (--optimizer {optimizer})"
    eps = getattr(ns, "adam_eps", None)
    if eps is not None and not (isinstance(eps, (int, float)) and eps >= 0):
        return f"argument --adam-eps: invalid value {eps!r}: expected a number >= 0 (--optimizer {optimizer})"
    return None


def _save_dir_error(ns) -> Optional[str]:
    save_dir = getattr(ns, "save_dir", None)
    if not save_dir or getattr(ns, "no_save", False):
        return None
    reason = unwritable_folder_reason(save_dir)
    # Only a file in the way: permissions (and CUDA for --fp16) belong to the machine that runs the
    # command, while the same command line is also parsed elsewhere (study plans, the per-layer report).
    if reason and "not a folder" in reason:
        return f"argument --save-dir: {save_dir} {reason}; GradInit's result and the checkpoints go there: give a " \
               "folder you can write"
    return None


def _train_split_error(ns) -> Optional[str]:
    data = getattr(ns, "data", None)
    subset = getattr(ns, "train_subset", None) or "train"
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


def training_setup_error(ns) -> Optional[str]:
    """The first setting of a parsed ``fairseq-train`` namespace that would fail only after the
    GradInit phase, as 'argument --flag: ...', or None (also when GradInit does not compute)."""
    iters = getattr(ns, "gradinit_iters", 0)
    if not (isinstance(iters, int) and iters > 0) or getattr(ns, "gradinit_init_file", None):
        return None
    for check in (_optimizer_error, _save_dir_error, _train_split_error):
        error = check(ns)
        if error:
            return error
    return None


def valid_split_error(task, model, plan) -> Optional[str]:
    """fairseq's refusal of a validation sample longer than the model and task allow (e.g. a long
    document with ``--sample-break-mode complete_doc``), which fairseq-train meets at its first
    validation, after the GradInit phase (and a validation split it cannot load). The splits are
    loaded here as fairseq-train loads them next. None with ``--skip-invalid-size-inputs-valid-test``
    or ``--disable-validation`` (read from the run's ``plan``)."""
    if True in (plan.setting("gradinit_skip_invalid_valid", False), plan.setting("gradinit_disable_validation", False)):
        return None
    from fairseq import utils

    subsets = [s for s in str(plan.setting("gradinit_valid_subset", "") or "").split(",") if s]
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    for subset in subsets:
        try:
            if subset not in task.datasets:
                task.load_dataset(subset, combine=False, epoch=1)
            dataset = task.datasets[subset]
        except (OSError, KeyError) as e:
            return f"validation split '{subset}' cannot be loaded ({type(e).__name__}: {e}); fix --valid-subset or the data"
        try:
            task.filter_indices_by_size(dataset.ordered_indices(), dataset, max_positions, ignore_invalid_inputs=False)
        except Exception as e:  # fairseq raises a bare Exception naming the sample
            return f"validation split '{subset}': {e} (found before GradInit)"
    return None


def precision_error(plan) -> Optional[str]:
    """``--fp16``/``--memory-efficient-fp16`` on a machine without CUDA: fairseq-train fails when it
    builds its fp16 optimizer, after the GradInit phase. Checked when the phase starts, on the machine
    that runs it (not when parsed: the same command line is parsed on other machines too)."""
    import torch

    for flag in ("fp16", "memory_efficient_fp16"):
        if plan.setting(f"gradinit_{flag}", False) is True and not torch.cuda.is_available():
            option = "--" + flag.replace("_", "-")
            return (f"{option}: fp16 training needs a CUDA GPU and this machine has none; fairseq-train would fail "
                    f"after the GradInit phase. Drop {option} to train in fp32 here, or run on a GPU")
    return None
