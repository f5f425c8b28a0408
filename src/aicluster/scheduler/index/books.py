"""Speed-up for the free-capacity index's hottest bookkeeping (``FreeIndex._change``): what a
change of one node's free GPUs reads besides the counts it changes, in one object per node.

Read from a table each (the node, its hash keys, its buckets, its rack's and pod's histograms,
its watts), they are far apart in memory: on 27,500 nodes a change took 1.9 us at random nodes
against 0.5 us at one node, again and again. Read from one object, ``_change``'s own samples in
a profiled 220,000-GPU Tiresias run fell from 772 to 599 (docs/benchmarks.md). The object holds
the same values (references to the same buckets and histograms), built once."""

from __future__ import annotations

__all__ = ["NodeBooks"]


class NodeBooks:
    """One node's fixed part of the index's bookkeeping."""

    __slots__ = ("buckets", "busy_more", "gpu_type", "gpus", "holes", "keys", "pod", "rack")

    def __init__(
        self,
        gpus: int,
        gpu_type: str,
        keys: tuple[int, ...],
        buckets: list[dict[int, None]],
        holes: list[int],
        rack: list[int],
        pod: list[int],
        busy_more: float,
    ) -> None:
        self.gpus = gpus
        self.gpu_type = gpu_type
        #: The content hash's key by free GPUs (empty where the index keeps no hash).
        self.keys = keys
        #: The buckets of the node's GPU type, and the keys deleted from each (_compact_bucket).
        self.buckets = buckets
        self.holes = holes
        #: The free-GPU histograms of the node's rack and pod.
        self.rack = rack
        self.pod = pod
        #: What each of its GPUs draws busy above idle, in watts.
        self.busy_more = busy_more
