"""What a simulation measures: per-job outcomes, sampled time series, and the run's summary.

Per-job values live in typed arrays (8 bytes a field) rather than objects, and time series are
sampled at a fixed step that doubles when the series grows too long, so memory stays small for
millions of jobs and any horizon.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aicluster.core.preemption_cost import PreemptionCost, total

__all__ = [
    "SERIES_COLUMNS",
    "JobTable",
    "RunTotals",
    "Series",
    "SimResult",
    "jain_index",
    "max_min_shares",
    "percentile",
    "preemption_summary",
    "summarize",
]

#: Columns of the sampled series: busy GPUs, queued and running jobs, nodes down, power draw,
#: and Jain's fairness index at that instant (NaN when tenants' demand fits the cluster).
SERIES_COLUMNS = ("busy_gpus", "queued_jobs", "running_jobs", "nodes_down", "watts", "jain")


class JobTable:
    """One row per arrived job, in arrival order; times in simulated seconds (NaN: not yet)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.tenant = array("l")
        self.gpus = array("l")
        self.submit = array("d")
        self.duration = array("d")
        self.start = array("d")
        self.end = array("d")
        self.restarts = array("l")

    def add(self, job_id: str, tenant: int, gpus: int, submit: float, duration: float) -> int:
        self.ids.append(job_id)
        self.tenant.append(tenant)
        self.gpus.append(gpus)
        self.submit.append(submit)
        self.duration.append(duration)
        self.start.append(math.nan)
        self.end.append(math.nan)
        self.restarts.append(0)
        return len(self.ids) - 1

    def __len__(self) -> int:
        return len(self.ids)


class Series:
    """Values sampled every ``step`` seconds from time 0; when ``max_points`` would be exceeded,
    every other point is dropped and the step doubles (a bounded, evenly spaced series)."""

    def __init__(self, step: float, max_points: int, columns: Sequence[str]) -> None:
        self.step = step
        self.max_points = max_points
        self.times = array("d")
        self.columns = {name: array("d") for name in columns}

    @property
    def next_time(self) -> float:
        return len(self.times) * self.step

    def add(self, values: Sequence[float]) -> None:
        if len(self.times) >= self.max_points:
            self._coarsen()
        self.times.append(self.next_time)
        for column, value in zip(self.columns.values(), values, strict=True):
            column.append(value)

    def _coarsen(self) -> None:
        self.times = self.times[::2]
        for name, column in self.columns.items():
            self.columns[name] = column[::2]
        self.step *= 2


@dataclass
class RunTotals:
    """Counters the engine accumulates while it runs (GPU-seconds unless named otherwise)."""

    allocated: float = 0.0
    lost_to_failures: float = 0.0
    lost_to_preemptions: float = 0.0
    restart_overhead: float = 0.0
    energy_joules: float = 0.0
    preemptions: int = 0
    failures: int = 0
    failure_interruptions: int = 0
    checkpoints: int = 0
    cycles: int = 0
    events: int = 0
    start_time: float = 0.0
    end_time: float = 0.0
    wall_seconds: float = 0.0
    data_jobs: int = 0  # jobs that read a dataset (sim.data)
    data_bytes_moved: int = 0
    data_wait_seconds: float = 0.0
    #: Per tenant: its jobs' preemptions by kind and their lost work (core.preemption_cost).
    by_tenant: dict[str, PreemptionCost] = field(default_factory=dict)

    def preemption_cost(self, tenant: str) -> PreemptionCost:
        found = self.by_tenant.get(tenant)
        if found is None:
            found = self.by_tenant[tenant] = PreemptionCost()
        return found


@dataclass
class SimResult:
    """Everything one run produced; :func:`summarize` turns it into figures."""

    policy: str
    cluster: str
    total_gpus: int
    tenants: list[str]
    tenant_gpu_seconds: list[float]
    jobs: JobTable
    series: Series
    totals: RunTotals
    settings: dict[str, Any] = field(default_factory=dict)
    #: The most each rack and each power budget drew after any batch of events, in watts, by
    #: name (only under power budgets).
    peak_watts: dict[str, float] = field(default_factory=dict)


def max_min_shares(
    demands: Sequence[float], weights: Sequence[float], capacity: float
) -> list[float]:
    """Weighted max-min fair allocation (water-filling) of ``capacity`` among demands."""
    shares = [0.0] * len(demands)
    order = sorted(range(len(demands)), key=lambda i: demands[i] / weights[i])
    left, weight_left = capacity, sum(weights)
    for position, i in enumerate(order):
        level = left / weight_left if weight_left > 0 else 0.0
        if demands[i] <= weights[i] * level:
            shares[i] = demands[i]
            left -= demands[i]
            weight_left -= weights[i]
            continue
        for j in order[position:]:
            shares[j] = weights[j] * level
        break
    return shares


def jain_index(values: Sequence[float]) -> float:
    """Jain's index (Σx)² / (n Σx²): 1 when all equal, 1/n when one takes everything."""
    squares = sum(x * x for x in values)
    if not values or squares == 0:
        return math.nan
    return sum(values) ** 2 / (len(values) * squares)


def _stats(values: np.ndarray, prefix: str) -> dict[str, float]:
    if values.size == 0:
        return {f"{prefix}_{name}": math.nan for name in ("mean", "median", "p95", "p99")}
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_median": float(p50),
        f"{prefix}_p95": float(p95),
        f"{prefix}_p99": float(p99),
    }


def _completed(jobs: JobTable) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Every job's end and submit time, and the completed jobs' JCT, queueing delay and
    slowdown (the statistics' sources)."""
    end = np.frombuffer(jobs.end, dtype=np.float64)
    submit = np.frombuffer(jobs.submit, dtype=np.float64)
    start = np.frombuffer(jobs.start, dtype=np.float64)
    duration = np.frombuffer(jobs.duration, dtype=np.float64)
    done = ~np.isnan(end)
    jct = end[done] - submit[done]
    per_job = {"jct": jct, "queue_delay": start[done] - submit[done]}
    per_job["slowdown"] = jct / duration[done]
    return end, submit, per_job


def percentile(result: SimResult, statistic: str, q: float) -> float:
    """The ``q``-th percentile (0-100) of completed jobs' ``jct``, ``queue_delay`` or
    ``slowdown``, for those :func:`summarize` does not report (it has p50, p95, p99)."""
    values = _completed(result.jobs)[2][statistic]
    return float(np.percentile(values, q)) if values.size else math.nan


def summarize(result: SimResult) -> dict[str, Any]:
    """The run's figures: JCT, queueing delay and slowdown statistics (over completed jobs),
    utilization, fairness, preemptions, failure losses, goodput and energy."""
    jobs, totals = result.jobs, result.totals
    end, submit, per_job = _completed(jobs)
    done = ~np.isnan(end)
    jct = per_job["jct"]
    span = totals.end_time - totals.start_time
    capacity = result.total_gpus * span
    wasted = totals.lost_to_failures + totals.lost_to_preemptions + totals.restart_overhead
    jain = np.frombuffer(result.series.columns["jain"], dtype=np.float64)
    jain = jain[~np.isnan(jain)]
    share_total = sum(result.tenant_gpu_seconds) or 1.0
    summary: dict[str, Any] = {
        "policy": result.policy,
        "cluster": result.cluster,
        "gpus": result.total_gpus,
        "jobs": len(jobs),
        "completed": int(done.sum()),
        "unfinished": int(len(jobs) - done.sum()),
        **_stats(jct, "jct"),
        **_stats(per_job["queue_delay"], "queue_delay"),
        **_stats(per_job["slowdown"], "slowdown"),
        "makespan": float(end[done].max() - submit.min()) if done.any() else math.nan,
        "simulated_seconds": span,
        "utilization": totals.allocated / capacity if capacity > 0 else math.nan,
        "jain_fairness": float(jain.mean()) if jain.size else math.nan,
        "preemptions": totals.preemptions,
        "failures": totals.failures,
        "failure_interruptions": totals.failure_interruptions,
        "lost_gpu_hours_failures": totals.lost_to_failures / 3600,
        "lost_gpu_hours_preemptions": totals.lost_to_preemptions / 3600,
        "restart_overhead_gpu_hours": totals.restart_overhead / 3600,
        "checkpoints": totals.checkpoints,
        "goodput": 1 - wasted / totals.allocated if totals.allocated > 0 else math.nan,
        "energy_kwh": totals.energy_joules / 3.6e6,
        "cycles": totals.cycles,
        "events": totals.events,
        "wall_seconds": totals.wall_seconds,
        "jobs_per_second": len(jobs) / totals.wall_seconds if totals.wall_seconds > 0 else 0.0,
        "tenant_share": {
            name: gpu_seconds / share_total
            for name, gpu_seconds in zip(result.tenants, result.tenant_gpu_seconds, strict=True)
        },
    }
    if totals.data_jobs:  # (only then: a replay without data keeps its figures, and digests)
        summary["data_gb_moved"] = totals.data_bytes_moved / 1e9
        summary["data_wait_hours"] = totals.data_wait_seconds / 3600
    if result.peak_watts:  # (only under budgets: other runs' figures stay as they were)
        summary["peak_kw"] = {
            name: watts / 1000 for name, watts in sorted(result.peak_watts.items())
        }
    return summary


def preemption_summary(result: SimResult) -> dict[str, Any]:
    """The cost of preemption (:mod:`aicluster.core.preemption_cost`): evictions per admitted
    GPU-hour, preemptions and lost GPU-hours by kind, and each tenant's figures. Apart from
    :func:`summarize`, whose figures the decision digests hash."""
    tenants: dict[str, PreemptionCost] = {}
    for name, gpu_seconds in zip(result.tenants, result.tenant_gpu_seconds, strict=True):
        cost = tenants[name] = result.totals.by_tenant.get(name, PreemptionCost()).copy()
        cost.admitted_gpu_seconds = gpu_seconds
    whole = total(tenants.values()).figures()
    return {
        "evictions_per_gpu_hour": whole["evictions_per_gpu_hour"],
        "preemptions_by_kind": whole["by_kind"],
        "lost_gpu_hours_by_kind": whole["lost_gpu_hours_by_kind"],
        "preemption_cost": {name: tenants[name].figures() for name in sorted(tenants)},
    }
