"""The cuDNN attention guard for fairseq-train (``--gradinit-cudnn-sdpa-guard``): the decision is
:mod:`fairseq_gradinit.core.sdpa_guard`'s; this module reads the run's precision and device from its
plan (:class:`~..settings.plan.GradInitPlan`)."""
from __future__ import annotations

from typing import Optional

from ...core.sdpa_guard import SdpaGuardDecision, guard_cudnn_sdpa

OPT_OUT = "--gradinit-cudnn-sdpa-guard off"


def _on(plan, name: str) -> bool:
    return plan.setting(name, False) is True


def training_precision(plan) -> str:
    """``fp16``, ``bf16``, ``amp`` or ``fp32``: the arithmetic of the run's attention. A GradInit
    phase in bf16 (``--gradinit-precision bf16``) counts as bf16: its passes take the same kernels."""
    if _on(plan, "gradinit_fp16") or _on(plan, "gradinit_memory_efficient_fp16"):
        return "fp16"
    if _on(plan, "gradinit_bf16") or _on(plan, "gradinit_memory_efficient_bf16"):
        return "bf16"
    if _on(plan, "gradinit_amp"):
        return "amp"
    if plan.computes and plan.setting("gradinit_precision", "fp32") == "bf16":
        return "bf16"
    return "fp32"


def guard_from_plan(plan) -> Optional[SdpaGuardDecision]:
    """Apply ``--gradinit-cudnn-sdpa-guard`` for the run a plan describes (None for a config
    without the option), on the run's device (:meth:`~..settings.plan.GradInitPlan.device`)."""
    mode = plan.setting("gradinit_cudnn_sdpa_guard")
    if mode is None:
        return None
    return guard_cudnn_sdpa(str(mode), precision=training_precision(plan), device=plan.device(), opt_out=OPT_OUT)
