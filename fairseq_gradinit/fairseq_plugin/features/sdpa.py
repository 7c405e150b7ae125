"""The cuDNN attention guard for fairseq-train (``--gradinit-cudnn-sdpa-guard``): the decision is
:mod:`fairseq_gradinit.core.sdpa_guard`'s; this module reads the run's precision and device."""
from __future__ import annotations

from typing import Optional

import torch

from ...core.sdpa_guard import SdpaGuardDecision, guard_cudnn_sdpa
from ..data.cfg import cfg_value

OPT_OUT = "--gradinit-cudnn-sdpa-guard off"


def _on(cfg, name: str) -> bool:
    return cfg_value(cfg, name, False) is True


def training_precision(cfg) -> str:
    """``fp16``, ``bf16``, ``amp`` or ``fp32``: the arithmetic of the run's attention. A GradInit
    phase in bf16 (``--gradinit-precision bf16``) counts as bf16: its passes take the same kernels."""
    if _on(cfg, "gradinit_fp16") or _on(cfg, "gradinit_memory_efficient_fp16"):
        return "fp16"
    if _on(cfg, "gradinit_bf16") or _on(cfg, "gradinit_memory_efficient_bf16"):
        return "bf16"
    if _on(cfg, "gradinit_amp"):
        return "amp"
    if cfg_value(cfg, "gradinit_iters", 0) and cfg_value(cfg, "gradinit_precision", "fp32") == "bf16":
        return "bf16"
    return "fp32"


def training_device(cfg) -> torch.device:
    """This process's GPU unless there is none or ``--cpu``."""
    if torch.cuda.is_available() and not _on(cfg, "gradinit_cpu"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def guard_from_cfg(cfg) -> Optional[SdpaGuardDecision]:
    """Apply ``--gradinit-cudnn-sdpa-guard`` for the run a task config describes (None for a config
    without the option)."""
    mode = cfg_value(cfg, "gradinit_cudnn_sdpa_guard", None)
    if mode is None:
        return None
    return guard_cudnn_sdpa(str(mode), precision=training_precision(cfg), device=training_device(cfg),
                            opt_out=OPT_OUT)
