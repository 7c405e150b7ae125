"""Pure-PyTorch GradInit engine (no fairseq import)."""
from .batching import BatchPair, authors_pairs, concat_batches, overlapping_pairs, slice_batch
from .config import GradInitConfig, ScaleBound
from .engine import (
    GradInit,
    GradInitResult,
    GradInitState,
    IterationRecord,
    ScaledModel,
    StepResult,
    gradinit,
    gradinit_step,
)
from .errors import ConfigError
from .metainit import MetaInit, MetaInitConfig, MetaInitRecord, MetaInitResult, gradient_quotient, metainit
from .modes import gradinit_mode, math_attention, unwrap_model
from .optim import ScaleAdam, ScaleAdamState, scale_adam_step
from .prefetch import DevicePrefetcher
from .scales import (
    ScaledParameters,
    apply_scales,
    default_param_filter,
    resolve_scale_bounds,
    scales_error,
    summarize_scales,
)

__all__ = [
    "BatchPair", "ConfigError", "DevicePrefetcher", "GradInit", "GradInitConfig", "GradInitResult", "GradInitState",
    "IterationRecord", "ScaleAdam", "ScaledModel", "StepResult", "gradinit_step",
    "ScaleAdamState", "ScaleBound", "scale_adam_step",
    "ScaledParameters", "resolve_scale_bounds",
    "apply_scales", "concat_batches", "default_param_filter", "gradinit", "gradinit_mode", "scales_error",
    "authors_pairs", "math_attention", "overlapping_pairs", "slice_batch", "summarize_scales", "unwrap_model",
    "MetaInit", "MetaInitConfig", "MetaInitRecord", "MetaInitResult", "gradient_quotient", "metainit",
]
