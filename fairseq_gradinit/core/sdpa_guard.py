"""A guard against a cuDNN attention kernel that returns NaN gradients.

From torch 2.11, on compute capability 9.x GPUs (Hopper), ``scaled_dot_product_attention``
dispatches half-precision attention with an explicit ``attn_mask`` to cuDNN by default, and cuDNN's
backward kernel returns NaN in the query gradient when the sequence length is 64 (mod 128) and a
query row's log-sum-exp is very negative (pytorch/pytorch#196678; fp16 and bf16 alike; fixed by
cuDNN 9.26, to which pytorch pull request 196861 upgrades). fairseq's self-attention takes that path,
so an fp16 run overflows on every batch of such a padded length, whatever its loss scale.

Which combinations are affected (:func:`assess`):

- torch before 2.11 (the fault is a regression of 2.11), a cuDNN runtime of 9.26 or later (the fix),
  a GPU of another compute capability, a CPU, fp32 training, or cuDNN attention already off: not affected;
- torch 2.11 to 2.13 with an older cuDNN on a 9.x GPU: affected (reported upstream with torch 2.11 and 2.13);
- a later torch with an older cuDNN: unknown from the version (its own guards may avoid the kernel),
  so the kernel is tried once on the reported small case (:func:`probe_kernel`, milliseconds).

:func:`guard_cudnn_sdpa` then turns cuDNN attention off (``torch.backends.cuda.enable_cudnn_sdp(False)``,
process-wide: the efficient and math kernels are correct on the same inputs) and says why.
"""
from __future__ import annotations

import contextlib
import logging
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Tuple

import torch

logger = logging.getLogger(__name__)

#: ``mode`` values: ``auto`` turns cuDNN attention off when the combination is affected and the
#: training runs in half precision; ``on`` always turns it off; ``off`` never touches it.
GUARD_MODES = ("auto", "on", "off")
#: Training precisions whose attention runs in half precision (``amp``: autocast to fp16/bf16).
HALF_PRECISIONS = ("fp16", "bf16", "amp", "float16", "bfloat16")
#: The first torch release with the bug, the first after it whose own guards are not known, and
#: the first cuDNN runtime (``torch.backends.cudnn.version()``) with the fix.
FIRST_AFFECTED_TORCH = (2, 11)
FIRST_UNKNOWN_TORCH = (2, 14)
FIXED_CUDNN = 92600
#: The compute capability (major) of the kernel with the bug (sm90).
AFFECTED_CAPABILITY = 9


@dataclass
class SdpaEnvironment:
    """What the decision depends on: versions, the GPU, and whether cuDNN attention is on now."""

    torch_version: str
    cudnn_version: Optional[int]  # torch.backends.cudnn.version(); None without cuDNN
    capability: Optional[Tuple[int, int]]  # of the training device; None on a CPU
    cudnn_sdp_enabled: bool

    @classmethod
    def detect(cls, device: Optional[torch.device] = None) -> "SdpaEnvironment":
        """This process's torch and cuDNN, and the capability of ``device`` (a CUDA device, or None)."""
        cuda = device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()
        capability = tuple(torch.cuda.get_device_capability(torch.device(device))) if cuda else None
        # ROCm builds answer with MIOpen's version here and have no cuDNN attention.
        rocm = getattr(torch.version, "hip", None) is not None
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() and not rocm else None
        return cls(torch_version=torch.__version__, cudnn_version=cudnn, capability=capability,
                   cudnn_sdp_enabled=bool(torch.backends.cuda.cudnn_sdp_enabled()))


@dataclass
class SdpaGuardDecision:
    """What the guard decided and why (recorded in ``gradinit.json`` and ``monitor.jsonl``)."""

    mode: str
    precision: str
    affected: Optional[bool]  # the combination has the bug (None: not assessed, mode "on"/"off")
    action: str  # "disabled" (cuDNN attention turned off here), "kept", "already off"
    reason: str
    environment: dict = field(default_factory=dict)
    probe: Optional[dict] = None  # the kernel test's result, when it ran

    def to_dict(self) -> dict:
        return asdict(self)


def torch_release(version: str) -> Tuple[int, int]:
    """(major, minor) of a torch version string such as ``2.11.0+cu130`` or ``2.14.0a0+git``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def assess(env: SdpaEnvironment, precision: str) -> Tuple[Optional[bool], str]:
    """``(affected, reason)`` from the versions alone; ``affected`` is None when only a test of the
    kernel can tell (a torch after 2.13 with a cuDNN older than the fix)."""
    if precision not in HALF_PRECISIONS:
        return False, f"{precision} training: the bug is in the half-precision kernel"
    if env.capability is None:
        return False, "not a CUDA device"
    if env.capability[0] != AFFECTED_CAPABILITY:
        return False, f"compute capability {env.capability[0]}.{env.capability[1]}: the bug is in the sm90 kernel"
    if not env.cudnn_sdp_enabled:
        return False, "cuDNN attention is already off"
    if env.cudnn_version is None:
        return False, "torch has no cuDNN"
    if torch_release(env.torch_version) < FIRST_AFFECTED_TORCH:
        return False, f"torch {env.torch_version} predates the bug (torch 2.11)"
    if env.cudnn_version >= FIXED_CUDNN:
        return False, f"cuDNN {env.cudnn_version} has the fix (9.26)"
    where = (f"torch {env.torch_version}, cuDNN {env.cudnn_version}, compute capability "
             f"{env.capability[0]}.{env.capability[1]}")
    if torch_release(env.torch_version) < FIRST_UNKNOWN_TORCH:
        return True, f"{where}: cuDNN attention returns NaN query gradients at lengths 64 (mod 128)"
    return None, where


def probe_kernel(dtype: torch.dtype = torch.float16, device: Optional[torch.device] = None, *,
                 cudnn_only: bool = True) -> dict:
    """Run cuDNN attention's backward once on the reported case (one head, length 192, head size 64,
    an all-True mask, every logit about -120) and report ``{"nonfinite_grad_q": n}``, or
    ``{"unavailable": message}`` when torch does not dispatch this case to cuDNN (then it cannot hit it).
    ``cudnn_only=False``: through torch's own choice of kernel instead, as training would run it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    length, dim = 192, 64
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = (torch.randn(1, 1, length, dim, generator=gen) * 0.1)
    k = (torch.randn(1, 1, length, dim, generator=gen) * 0.1)
    v = torch.randn(1, 1, length, dim, generator=gen)
    q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(dim)
    q, k, v = (t.to(device=device, dtype=dtype).requires_grad_() for t in (q, k, v))
    mask = torch.ones(1, 1, length, length, dtype=torch.bool, device=device)
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]) if cudnn_only else contextlib.nullcontext():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out.backward(torch.ones_like(out))
    except RuntimeError as e:
        return {"unavailable": str(e).splitlines()[0][:200]}
    return {"nonfinite_grad_q": int((~torch.isfinite(q.grad)).sum())}


def decide(mode: str = "auto", *, precision: str, env: SdpaEnvironment,
           probe: Optional[Callable[[], dict]] = None, device: Optional[torch.device] = None) -> SdpaGuardDecision:
    """The guard's decision for a training run in ``precision`` (``fp32``, ``fp16``, ``bf16``,
    ``amp``); ``probe`` tests the kernel when the versions cannot tell (default :func:`probe_kernel`)."""
    if mode not in GUARD_MODES:
        raise ValueError(f"cuDNN attention guard mode {mode!r}: use one of {', '.join(GUARD_MODES)}")
    envd = asdict(env)
    if mode == "off":  # assessed from the versions only, so that the record says what was risked
        affected, reason = assess(env, precision)
        return SdpaGuardDecision(mode, precision, affected, "kept", f"the guard is off; {reason}", envd)
    if not env.cudnn_sdp_enabled:
        return SdpaGuardDecision(mode, precision, None if mode == "on" else False, "already off",
                                 "cuDNN attention is already off", envd)
    if mode == "on":
        return SdpaGuardDecision(mode, precision, None, "disabled", "the guard is on", envd)
    affected, reason = assess(env, precision)
    result = None
    if affected is None:
        dtype = torch.bfloat16 if precision in ("bf16", "bfloat16") else torch.float16
        result = (probe or (lambda: probe_kernel(dtype, torch.device(device or "cuda"))))()
        affected = bool(result.get("nonfinite_grad_q"))
        reason = (f"{reason}: a test of cuDNN attention's backward gave "
                  + (f"{result['nonfinite_grad_q']} non-finite query gradients" if "nonfinite_grad_q" in result
                     else f"no cuDNN kernel ({result['unavailable']})"))
    return SdpaGuardDecision(mode, precision, affected, "disabled" if affected else "kept", reason, envd, result)


def guard_cudnn_sdpa(mode: str = "auto", *, precision: str, device: Optional[torch.device] = None,
                     env: Optional[SdpaEnvironment] = None, probe: Optional[Callable[[], dict]] = None,
                     opt_out: str = "mode='off'") -> SdpaGuardDecision:
    """Decide (:func:`decide`) for a training run on ``device`` in ``precision`` and act: turn cuDNN
    attention off process-wide when the decision says so, with one log line saying why and how to
    opt out (``opt_out``: the front end's way to say ``mode="off"``). Call it before the model's first
    forward pass. Returns the decision."""
    env = env if env is not None else SdpaEnvironment.detect(device)
    decision = decide(mode, precision=precision, env=env, probe=probe, device=device)
    if decision.action == "disabled":
        torch.backends.cuda.enable_cudnn_sdp(False)
        logger.warning("cuDNN attention turned off for this run (%s); the efficient/math attention kernels are "
                       "used instead; to keep cuDNN attention: %s", decision.reason, opt_out)
    elif decision.affected:
        logger.warning("cuDNN attention kept although it is affected (%s)", decision.reason)
    return decision
