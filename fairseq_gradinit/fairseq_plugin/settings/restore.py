"""Which checkpoint ``fairseq-train`` will restore: GradInit runs only for a fresh model.

A mirror of fairseq's own checkpoint logic. The run's plan holds fairseq's checkpoint settings as
:class:`Checkpointing` (:func:`checkpointing`, read where the plan is resolved); :func:`restore_source`
answers for a raw config as well."""
import dataclasses
import os
from typing import Optional

from ..data.cfg import cfg_value
from .options import fairseq_default


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """fairseq's checkpoint settings of a run, as fairseq reads them."""

    save_dir: str
    restore_file: str
    #: ``--checkpoint-suffix`` (Trainer.checkpoint_suffix without FSDP).
    suffix: str
    finetune_from_model: Optional[str]
    continue_once: Optional[str]
    #: Whether any ``--reset-*`` flag is given (they never stop the weights from loading).
    reset: bool
    no_save: bool
    no_last_checkpoints: bool


def checkpointing(cfg) -> Checkpointing:
    """The checkpoint settings of a task config or a plan's settings (``gradinit_*`` fields); an unresolvable
    one takes fairseq's own default, as fairseq-train would run with it."""
    return Checkpointing(
        save_dir=str(_setting(cfg, "gradinit_save_dir")),
        restore_file=str(_setting(cfg, "gradinit_restore_file")),
        suffix=str(_setting(cfg, "gradinit_checkpoint_suffix") or ""),
        finetune_from_model=cfg_value(cfg, "gradinit_finetune_from_model"),
        continue_once=cfg_value(cfg, "gradinit_continue_once"),
        reset=any(cfg_value(cfg, f"gradinit_reset_{k}", False) for k in ("optimizer", "lr_scheduler", "meters",
                                                                           "dataloader")),
        no_save=cfg_value(cfg, "gradinit_no_save") is True,
        no_last_checkpoints=cfg_value(cfg, "gradinit_no_last_checkpoints") is True,
    )


def _setting(cfg, name: str):
    return cfg_value(cfg, name, fairseq_default(name))


def restore_path(settings: Checkpointing) -> Optional[str]:
    """The checkpoint ``fairseq-train`` will load model weights from, or None for a fresh model.

    A line-by-line mirror of fairseq's ``checkpoint_utils.load_checkpoint`` (which path: the
    ``--save-dir``'s ``checkpoint_last{suffix}.pt``, else ``--continue-once``, else
    ``--finetune-from-model``; or ``--restore-file`` with the suffix) and ``Trainer.load_checkpoint``
    (weights load iff that path is a file). The option combinations fairseq refuses raise its own
    ``ValueError`` here, before GradInit spends any time, instead of after it. Read from the save dir as
    it is when asked: which checkpoint is restored is a fact of the run's start, not a setting.
    """
    from fairseq.file_io import PathManager

    finetune, restore = settings.finetune_from_model, settings.restore_file
    if finetune is not None and settings.reset:
        raise ValueError("--finetune-from-model can not be set together with either --reset-optimizer"
                         " or reset_lr_scheduler or reset_meters or reset_dataloader")
    if restore == "checkpoint_last.pt":
        path = os.path.join(settings.save_dir, f"checkpoint_last{settings.suffix}.pt")
        first_launch = not PathManager.exists(path)
        if first_launch and settings.continue_once is not None:
            path = settings.continue_once
        elif finetune is not None and first_launch:
            if not PathManager.exists(finetune):
                raise ValueError(f"--finetune-from-model {finetune} does not exist")
            path = finetune
    else:
        path = restore.replace(".pt", settings.suffix + ".pt")
    if restore != "checkpoint_last.pt" and finetune:
        raise ValueError("--finetune-from-model and --restore-file (non-default value) can not be specified together")
    return path if PathManager.isfile(path) else None


def restore_source(cfg) -> Optional[str]:
    """:func:`restore_path` of a task config (``gradinit_*`` fields)."""
    return restore_path(checkpointing(cfg))


def will_restore_checkpoint(cfg) -> bool:
    """Whether fairseq-train will load model weights from a checkpoint (see :func:`restore_path`)."""
    return restore_source(cfg) is not None
