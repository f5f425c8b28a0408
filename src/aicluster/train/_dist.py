"""Small collectives the train library runs on a process group of its own.

The library's agreements (should every rank stop? which checkpoint do we load?) must never
interleave with the job's own collectives (DDP's all-reduces on the default group, maybe NCCL),
so they run on a separate gloo group, created lazily by the first call: every rank must make the
same calls in the same order, as with any collective.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["broadcast_int", "control_group", "forget_groups", "max_int", "rank_and_world"]

_control: dist.ProcessGroup | None = None


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size; ``(0, 1)`` without a process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def control_group() -> dist.ProcessGroup | None:
    """The library's gloo group (``None`` in a world of one or without torch.distributed)."""
    global _control
    import torch.distributed as dist

    if _control is None and rank_and_world()[1] > 1:
        _control = dist.new_group(backend="gloo")
    return _control


def forget_groups() -> None:
    """Drop the cached group (called when the process group is destroyed)."""
    global _control
    _control = None


def broadcast_int(value: int, src: int = 0) -> int:
    """Rank ``src``'s ``value`` on every rank (an int64 tensor: nothing is pickled)."""
    import torch
    import torch.distributed as dist

    group = control_group()
    if group is None:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(tensor, src=src, group=group)
    return int(tensor.item())


def max_int(value: int) -> int:
    """The largest ``value`` over all ranks."""
    import torch
    import torch.distributed as dist

    group = control_group()
    if group is None:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())
