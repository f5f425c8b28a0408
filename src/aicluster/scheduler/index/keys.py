"""The free-capacity index's content hash: a Zobrist hash of each node's free GPUs and whether it
is schedulable, and of its free CPUs and memory, that comes back to the same value whenever the
content does."""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

from aicluster.core import Node

__all__ = ["content_hash", "host_key", "zobrist_keys"]


def zobrist_keys(nodes: Sequence[Node]) -> list[tuple[int, ...]]:
    """Each node's keys by free GPUs, and past its GPU count the key that marks it out of
    placement."""
    return [
        tuple(_zobrist_key(i, free) for free in range(node.gpus + 2))
        for i, node in enumerate(nodes)
    ]


def content_hash(
    keys: Sequence[tuple[int, ...]], free: Sequence[int], host_keys: Sequence[int]
) -> int:
    """The hash of schedulable nodes with ``free`` GPUs, and CPUs and memory (their
    :func:`host_key` each)."""
    hashed = 0
    for i, gpus in enumerate(free):
        hashed ^= keys[i][gpus] ^ host_keys[i]
    return hashed


# Keys, and so every XOR of them, fit in 62 bits: the compiled build (setup.py) keeps such an
# int unboxed (mypyc's short ints), where a 64-bit one is a Python object made at every change.
_KEY_BITS = (1 << 62) - 1


def _zobrist_key(node: int, value: int) -> int:
    """A fixed pseudo-random 62-bit key per (node, value): the same in every run."""
    digest = blake2b(f"{node}:{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _KEY_BITS


def host_key(node: int, free_millicpus: int, free_memory_mib: int) -> int:
    """The content hash's key for a node's free CPUs and memory. Python's hash of a tuple of
    ints is the same in every run (only strings are salted) and cheap, which matters here: it
    is taken twice per change (a fixed random key per value, as for GPUs, cannot be tabled for
    values as many as these); its low 62 bits, as the GPU keys."""
    return hash((node, free_millicpus, free_memory_mib)) & _KEY_BITS
