"""Each tenant's GPUs in a simulation, and how fairly they are shared (Jain's index)."""

from __future__ import annotations

import math

from aicluster.sim.metrics import jain_index, max_min_shares

__all__ = ["TenantShares"]


class TenantShares:
    """Per tenant, by order of arrival: its weight, the GPU-seconds its finished runs held, the
    GPUs it holds now and the GPUs its arrived, unfinished jobs ask for."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.weights: list[float] = []
        self.alloc: list[float] = []  # GPU-seconds of finished runs
        self.running: list[int] = []  # GPUs held now
        self.demand: list[int] = []  # GPUs of jobs arrived and not finished

    def add(self, name: str, weight: float) -> int:
        """A tenant seen for the first time: its index."""
        found = self.ids[name] = len(self.ids)
        self.weights.append(weight)
        self.alloc.append(0.0)
        self.running.append(0)
        self.demand.append(0)
        return found

    def fairness(self, capacity: int) -> float:
        """Jain's index of each active tenant's GPUs over its weighted max-min fair share of
        ``capacity``, when tenants' demand exceeds it (NaN otherwise: everyone gets its demand)."""
        active = [i for i, demand in enumerate(self.demand) if demand > 0]
        demands = [float(self.demand[i]) for i in active]
        if len(active) < 2 or capacity <= 0 or sum(demands) <= capacity:
            return math.nan
        weights = [self.weights[i] for i in active]
        fair = max_min_shares(demands, weights, capacity)
        return jain_index([self.running[i] / f for i, f in zip(active, fair, strict=True)])
