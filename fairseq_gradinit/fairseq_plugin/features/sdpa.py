"""The cuDNN attention guard for fairseq-train (``--gradinit-cudnn-sdpa-guard``): the decision is
:mod:`fairseq_gradinit.core.sdpa_guard`'s; this module reads the run's precision and device from its
plan (:class:`~..settings.plan.RunPlan`)."""
from __future__ import annotations

from typing import Optional

from ...core.sdpa_guard import SdpaGuardDecision, guard_cudnn_sdpa

OPT_OUT = "--gradinit-cudnn-sdpa-guard off"


def training_precision(plan) -> str:
    """``fp16``, ``bf16``, ``amp`` or ``fp32``: the arithmetic of the run's attention. A GradInit
    phase in bf16 (``--gradinit-precision bf16``) counts as bf16: its passes take the same kernels."""
    training = plan.training
    if training.fp16 or training.memory_efficient_fp16:
        return "fp16"
    if training.bf16 or training.memory_efficient_bf16:
        return "bf16"
    if training.amp:
        return "amp"
    if plan.computes and plan.phase_precision == "bf16":
        return "bf16"
    return "fp32"


def guard_from_plan(plan) -> Optional[SdpaGuardDecision]:
    """Apply ``--gradinit-cudnn-sdpa-guard`` for the run a plan describes (None for a config
    without the option), on the run's device (:meth:`~..settings.plan.RunPlan.device`)."""
    mode = plan.cudnn_sdpa_guard
    if mode is None:
        return None
    return guard_cudnn_sdpa(str(mode), precision=training_precision(plan), device=plan.device(), opt_out=OPT_OUT)
