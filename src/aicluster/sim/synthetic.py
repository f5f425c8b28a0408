"""A seeded synthetic workload shaped like Philly, for clusters of any size.

Arrivals are a Poisson process whose rate is set to offer a chosen load (GPU demand over
capacity); GPU counts follow the Philly histogram (optionally scaled up: big clusters run bigger
jobs); durations are lognormal with Philly's median (19 min) and mean (3.6 h). Jobs are generated
lazily, so a month on 100,000 GPUs streams without holding the trace in memory.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar

from aicluster.sim.traces import TraceJob

_T = TypeVar("_T")

__all__ = ["PHILLY_GPU_MIX", "SyntheticMix", "arrival_rate", "synthetic_jobs"]

#: Jobs per GPU count in the Philly trace (82,247 jobs).
PHILLY_GPU_MIX: tuple[tuple[int, int], ...] = (
    (1, 76627),
    (2, 1818),
    (4, 1870),
    (8, 1643),
    (12, 7),
    (16, 199),
    (24, 7),
    (32, 67),
    (64, 6),
    (128, 3),
)


@dataclass(frozen=True, slots=True)
class SyntheticMix:
    """The job mix: GPU counts (× ``gpu_scale``), lognormal durations, skewed tenants.

    ``sigma`` 2.2 with median 1,140 s gives a mean of ≈ 3.6 h, as in Philly; durations are
    clipped to [1 s, ``max_duration``]. Tenant ``i`` of ``tenants`` submits in proportion to
    1/(i+1) (a few big teams, many small ones, as in Philly's virtual clusters).
    """

    gpu_mix: tuple[tuple[int, int], ...] = PHILLY_GPU_MIX
    gpu_scale: int = 1
    median_duration: float = 1140.0
    sigma: float = 2.2
    max_duration: float = 30 * 86400.0
    tenants: int = 15

    def __post_init__(self) -> None:
        if self.gpu_scale < 1 or self.tenants < 1 or not self.gpu_mix:
            raise ValueError("gpu_scale and tenants must be at least 1 and gpu_mix non-empty")
        if self.median_duration <= 0 or self.sigma < 0 or self.max_duration < 1:
            raise ValueError("durations must be positive")

    def mean_gpus(self) -> float:
        total = sum(weight for _, weight in self.gpu_mix)
        return self.gpu_scale * sum(gpus * weight for gpus, weight in self.gpu_mix) / total

    def mean_duration(self) -> float:
        """Mean of the clipped lognormal: E[min(X, c)], in closed form."""
        mu, sigma, cap = math.log(self.median_duration), self.sigma, self.max_duration
        if sigma == 0:
            return min(self.median_duration, cap)
        z = (math.log(cap) - mu) / sigma
        below = math.exp(mu + sigma * sigma / 2) * _phi(z - sigma)
        return below + cap * (1 - _phi(z))


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def arrival_rate(total_gpus: int, load: float, mix: SyntheticMix) -> float:
    """Jobs per second that offer ``load`` × ``total_gpus`` busy GPUs on average."""
    return load * total_gpus / (mix.mean_gpus() * mix.mean_duration())


def synthetic_jobs(
    rng: random.Random,
    *,
    total_gpus: int,
    load: float = 0.7,
    horizon: float = 7 * 86400.0,
    mix: SyntheticMix | None = None,
) -> Iterator[TraceJob]:
    """Jobs arriving in ``[0, horizon)``, in submission order, drawn only from ``rng``."""
    if load <= 0 or total_gpus <= 0:
        raise ValueError("load and total_gpus must be positive")
    mix = mix or SyntheticMix()
    rate = arrival_rate(total_gpus, load, mix)
    sizes = [gpus * mix.gpu_scale for gpus, _ in mix.gpu_mix]
    size_weights = list(accumulate(weight for _, weight in mix.gpu_mix))
    tenants = [f"team-{i:02d}" for i in range(mix.tenants)]
    tenant_weights = list(accumulate(1 / (i + 1) for i in range(mix.tenants)))
    mu = math.log(mix.median_duration)
    now, count = 0.0, 0
    while True:
        now += rng.expovariate(rate)
        if now >= horizon:
            return
        duration = min(max(1.0, rng.lognormvariate(mu, mix.sigma)), mix.max_duration)
        yield TraceJob(
            id=f"syn-{count}",
            submit_time=now,
            duration=duration,
            num_gpus=_choice(rng, sizes, size_weights),
            tenant=_choice(rng, tenants, tenant_weights),
        )
        count += 1


def _choice(rng: random.Random, population: Sequence[_T], cum_weights: Sequence[float]) -> _T:
    """``rng.choices(population, cum_weights=cum_weights)[0]``, the same draw from the same
    state, without building the one-element list (twice per job of a month at 220,000 GPUs)."""
    drawn = rng.random() * (cum_weights[-1] + 0.0)
    return population[bisect_right(cum_weights, drawn, 0, len(cum_weights) - 1)]
