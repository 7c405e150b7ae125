"""Which checkpoint ``fairseq-train`` will restore: GradInit runs only for a fresh model.

A mirror of fairseq's own checkpoint logic: it reads fairseq's checkpoint settings the way fairseq
does (:func:`~..data.cfg.cfg_value`), from the run's plan or from a raw config alike."""
import os
from typing import Optional

from ..data.cfg import cfg_value


def restore_source(cfg) -> Optional[str]:
    """The checkpoint ``fairseq-train`` will load model weights from, or None for a fresh model.

    A line-by-line mirror of fairseq's ``checkpoint_utils.load_checkpoint`` (which path: the
    ``--save-dir``'s ``checkpoint_last{suffix}.pt``, else ``--continue-once``, else
    ``--finetune-from-model``; or ``--restore-file`` with the suffix) and ``Trainer.load_checkpoint``
    (weights load iff that path is a file). The ``--reset-*`` flags never stop the weights from
    loading. The option combinations fairseq refuses raise its own ``ValueError`` here, before
    GradInit spends any time, instead of after it.
    """
    from fairseq.file_io import PathManager

    save_dir = cfg_value(cfg, "gradinit_save_dir", "checkpoints")
    restore = cfg_value(cfg, "gradinit_restore_file", "checkpoint_last.pt")
    suffix = cfg_value(cfg, "gradinit_checkpoint_suffix", "") or ""  # Trainer.checkpoint_suffix without FSDP
    finetune = cfg_value(cfg, "gradinit_finetune_from_model")
    continue_once = cfg_value(cfg, "gradinit_continue_once")
    resets = [cfg_value(cfg, f"gradinit_reset_{k}", False) for k in ("optimizer", "lr_scheduler", "meters", "dataloader")]
    if finetune is not None and any(resets):
        raise ValueError("--finetune-from-model can not be set together with either --reset-optimizer"
                         " or reset_lr_scheduler or reset_meters or reset_dataloader")
    if restore == "checkpoint_last.pt":
        path = os.path.join(save_dir, f"checkpoint_last{suffix}.pt")
        first_launch = not PathManager.exists(path)
        if first_launch and continue_once is not None:
            path = continue_once
        elif finetune is not None and first_launch:
            if not PathManager.exists(finetune):
                raise ValueError(f"--finetune-from-model {finetune} does not exist")
            path = finetune
    else:
        path = restore.replace(".pt", suffix + ".pt")
    if restore != "checkpoint_last.pt" and finetune:
        raise ValueError("--finetune-from-model and --restore-file (non-default value) can not be specified together")
    return path if PathManager.isfile(path) else None


def will_restore_checkpoint(cfg) -> bool:
    """Whether fairseq-train will load model weights from a checkpoint (see :func:`restore_source`)."""
    return restore_source(cfg) is not None
