"""What ``fairseq-train`` builds before its first update, shared by the task, the report, provenance
and Admin profiling: the config of a command line, the model, and the training batches."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import numpy as np
import torch
from fairseq import utils

from ...core.batching import slice_batch

logger = logging.getLogger(__name__)


@dataclass
class FairseqModel:
    cfg: Any
    task: Any
    model: torch.nn.Module
    criterion: torch.nn.Module
    device: torch.device


def training_config(argv: Sequence[str], *, defaults: bool = False):
    """The omegaconf config ``fairseq-train argv`` runs with (``--user-dir`` imported).

    ``defaults``: fill in the model's defaults as ``fairseq_cli.train.main`` does first thing
    (``add_defaults``). A bad argument exits like ``fairseq-train`` does (``SystemExit(2)``).
    """
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=list(argv))
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    if defaults:
        from fairseq.dataclass.initialize import add_defaults

        add_defaults(cfg)
    return cfg


def build_from_config(cfg):
    """(task, model, criterion) of the config ``cfg`` in fairseq-train's seeding and construction
    order (fairseq_cli/train.py): nothing else draws random numbers before build_model, so the
    weights are fairseq-train's initialization; the task runs GradInit in build_criterion when
    ``cfg`` asks for it."""
    from fairseq import tasks

    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion


def build_training_model(train_argv: Sequence[str], *, device: Optional[str] = None,
                         gradinit: bool = False) -> FairseqModel:
    """The model, task and criterion ``fairseq-train train_argv`` would start training from.

    ``gradinit`` False drops ``--gradinit-iters``/``--gradinit-init-file`` (the caller applies
    scales itself); True lets the task run GradInit in ``build_criterion`` as fairseq-train does.
    """
    # A reader of the run (no GradInit here) writes nothing into its --save-dir, which need not be writable on
    # this machine: --no-save keeps the parse's checks of that folder out of its way.
    cfg = training_config(list(train_argv) + ([] if gradinit else ["--no-save"]))
    if not gradinit:
        for key, off in (("gradinit_iters", 0), ("gradinit_init_file", None)):
            if getattr(cfg.task, key, off) not in (off, None):
                logger.info("ignoring --%s (scales are applied by the caller)", key.replace("_", "-"))
                setattr(cfg.task, key, off)
    task, model, criterion = build_from_config(cfg)
    if device is None:
        device = "cuda" if torch.cuda.is_available() and not cfg.common.cpu else "cpu"
    dev = torch.device(device)
    model.to(dev)
    criterion.to(dev)
    return FairseqModel(cfg=cfg, task=task, model=model, criterion=criterion, device=dev)


def training_dataset(task, split: Optional[str] = None):
    """The task's training split (loaded as fairseq-train loads it, if not loaded yet)."""
    cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    split = split or getattr(cfg, "train_subset", None) or "train"
    if split not in task.datasets:
        task.load_dataset(split, epoch=1, combine=True)
    return task.dataset(split)


def training_iterator(task, model, dataset, *, max_tokens: Optional[int], batch_size: Optional[int] = None,
                      seed: int = 1, required_batch_size_multiple: int = 1):
    """The task's own training iterator, unsharded, as fairseq-train's ``Trainer.get_train_iterator``
    makes it: ``get_batch_iterator`` with the token and sentence budgets, positions limited by the
    model, the task and ``max_tokens``, over-long samples skipped with fairseq's warning."""
    if not max_tokens and not batch_size:
        raise ValueError("set --max-tokens (or --batch-size) to batch the training data")
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions(), max_tokens)
    return task.get_batch_iterator(
        dataset=dataset, max_tokens=max_tokens, max_sentences=batch_size, max_positions=max_positions,
        ignore_invalid_inputs=True, required_batch_size_multiple=required_batch_size_multiple, seed=seed,
        num_shards=1, shard_id=0, num_workers=0, epoch=1, disable_iterator_cache=True), max_positions


def training_batch_indices(task, model, dataset, *, max_tokens: Optional[int], batch_size: Optional[int] = None,
                           seed: int = 1, required_batch_size_multiple: int = 1) -> List[np.ndarray]:
    """The sample indices of each batch of :func:`training_iterator`, in its (unshuffled) order;
    logs how many samples were skipped and raises ``ValueError`` when every one was."""
    itr, max_positions = training_iterator(task, model, dataset, max_tokens=max_tokens, batch_size=batch_size,
                                           seed=seed, required_batch_size_multiple=required_batch_size_multiple)
    batches = [np.asarray(b, dtype=np.int64) for b in itr.frozen_batches if len(b)]
    skipped = len(dataset) - sum(len(b) for b in batches)
    if not batches:
        raise ValueError(f"every one of the {len(dataset)} training samples was skipped: each is longer than the "
                         f"positions the model and task allow ({max_positions}) or than a batch of {max_tokens} "
                         "tokens; raise --max-tokens/--gradinit-max-tokens or the --max-*-positions")
    if skipped > 0:
        logger.warning("gradinit: %d of %d training samples skipped (longer than max positions %s or a batch of %s tokens)",
                       skipped, len(dataset), max_positions, max_tokens)
    return batches


def collate(dataset, idx, device) -> dict:
    """The fairseq sample of ``dataset``'s items ``idx`` (the dataset's own collater), on ``device``."""
    sample = dataset.collater([dataset[int(i)] for i in idx])
    return utils.apply_to_sample(lambda t: t.to(device), sample)


def slice_sample(sample: dict, start: int, stop: int, pad: int) -> dict:
    """Rows ``start:stop`` of a collated fairseq sample, as the authors' fairseq code cuts its S and S~:
    every tensor sliced along the rows (the padded width kept), ``nsentences`` the rows kept and
    ``ntokens`` the target tokens that are not ``pad``."""
    if not isinstance(sample.get("target"), torch.Tensor):
        raise ValueError("--gradinit-pairs authors cuts a collated batch into S and S~ and counts their target "
                         "tokens: this task's samples have no 'target' tensor; use --gradinit-pairs overlap")
    out = slice_batch(sample, start, stop)
    out["nsentences"] = stop - start
    out["ntokens"] = int((out["target"] != pad).sum())
    return out
