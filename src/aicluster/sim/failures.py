"""Node failures: each GPU fails as an independent Poisson process (exponential MTBF).

A node of ``g`` GPUs then fails at rate ``g / MTBF_gpu``, and the whole cluster at rate
``total_gpus / MTBF_gpu``: the model draws one cluster-wide exponential gap and picks the failed
node with probability proportional to its GPUs. A node drawn while it is already down is skipped
(thinning), which is exactly the process of up nodes failing at their own rates.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from itertools import accumulate

from aicluster.core import Cluster
from aicluster.sim.config import SimConfig

__all__ = ["FailureModel", "failure_model"]


class FailureModel:
    """Draws the next node failure from a seeded ``random.Random`` (never global random)."""

    def __init__(self, cluster: Cluster, gpu_hours_per_failure: float, rng: random.Random) -> None:
        if gpu_hours_per_failure <= 0:
            raise ValueError("gpu_hours_per_failure must be positive")
        self.names = [node.name for node in cluster.nodes if node.gpus > 0]
        self.cumulative = list(accumulate(node.gpus for node in cluster.nodes if node.gpus > 0))
        total = self.cumulative[-1] if self.cumulative else 0
        self.rate = total / (gpu_hours_per_failure * 3600.0)  # failures per second
        self.rng = rng

    def node_mtbf_hours(self, gpus: int) -> float:
        """Mean time between failures of a node with ``gpus`` GPUs, in hours."""
        return self.cumulative[-1] / (self.rate * 3600.0 * gpus) if self.rate else float("inf")

    def next_failure(self, now: float) -> tuple[float, str] | None:
        """When the next failure happens after ``now`` and on which node (None: never)."""
        if self.rate <= 0:
            return None
        when = now + self.rng.expovariate(self.rate)
        gpu = self.rng.randrange(self.cumulative[-1])
        return when, self.names[bisect_right(self.cumulative, gpu)]


def failure_model(cluster: Cluster, config: SimConfig) -> FailureModel | None:
    """Node failures drawn at the configured rate, seeded (None when failures are off)."""
    if not config.failures:
        return None
    seed = random.Random(f"failures:{config.seed}")
    return FailureModel(cluster, config.gpu_hours_per_failure, seed)
