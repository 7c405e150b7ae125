"""Count the points where the host waits for the device (host syncs) inside a block of code.

On every device, the operations that make the host wait on an accelerator are counted: the aten
operators that read tensor data back to Python or size their output by it (``item``/``bool``/
``float``/``int`` via ``_local_scalar_dense``, ``nonzero``, ``masked_select``, ``unique``,
``repeat_interleave`` without ``output_size``, ``equal``) and the Python-level reads ``tolist``,
``cpu`` and ``numpy`` (a CPU tensor serves them without dispatching an operator). On CUDA, torch's
sync debug mode also reports every call that synchronizes the host with the device (a copy to the
host, a pageable-memory upload, ``torch.cuda.synchronize``...): each report counts as ``cuda_sync``,
so a ``.tolist()`` of a CUDA tensor counts once as ``tolist`` and once as ``cuda_sync``. On a CPU
this also counts reads of tensors that stay on the host on any device (fairseq turns shapes into
CPU tensors and compares them), so compare counts, as the tests do, against a baseline measured
the same way.

    with HostSyncCounter(device) as syncs:
        engine.step(pair)
    print(syncs.total, syncs.counts)
"""
from __future__ import annotations

import collections
import warnings
from typing import Dict, Union

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten operators that read device data back to the host (or size their output by it).
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "equal", "allclose")
#: Tensor methods that hand data to Python without dispatching an aten operator on a CPU tensor.
SYNC_METHODS = ("tolist", "cpu", "numpy")


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SYNC_OPS or (name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 4):
            self.counts[name] += 1
        return func(*args, **kwargs)


class HostSyncCounter:
    """Context manager counting host syncs (see the module docstring); ``counts`` by operation."""

    def __init__(self, device: Union[str, torch.device] = "cpu"):
        self.device = torch.device(device)
        self.counts: Dict[str, int] = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> "HostSyncCounter":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._previous = torch.cuda.get_sync_debug_mode()
            self._warnings = warnings.catch_warnings(record=True)
            self._records = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        self._saved = {m: getattr(torch.Tensor, m) for m in SYNC_METHODS}
        counts = self.counts

        def counted(name, method):
            def wrapper(self, *args, **kwargs):
                counts[name] += 1
                return method(self, *args, **kwargs)
            return wrapper

        for name, method in self._saved.items():
            setattr(torch.Tensor, name, counted(name, method))
        self._mode = _DispatchCounter(counts)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode(self._previous)
            self._warnings.__exit__(*exc)
            for w in self._records:
                if "synchroniz" in str(w.message):
                    self.counts["cuda_sync"] += 1
