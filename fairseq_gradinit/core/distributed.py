"""Data-parallel helpers of the scale-learning engines (GradInit, MetaInit)."""
from __future__ import annotations

from typing import Any, List, Sequence

import torch
import torch.distributed as dist


class DataParallelGroup:
    """Mean all-reduce and broadcast over a data-parallel group; no-ops in a single process."""

    def __init__(self, process_group=None):
        if process_group is None and dist.is_available() and dist.is_initialized():
            process_group = dist.group.WORLD
        self.group = process_group
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        self.src = dist.get_global_rank(process_group, 0) if process_group is not None and \
            process_group is not dist.group.WORLD else 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def mean_(self, tensors: Sequence[torch.Tensor]) -> None:
        if not self.active or not tensors:
            return
        # One flat buffer per dtype/device: a single collective instead of one per tensor.
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=self.group)
        flat.div_(self.world_size)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in a single process."""
        if not self.active:
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        if not self.active:
            return
        for t in tensors:
            dist.broadcast(t, src=self.src, group=self.group)
