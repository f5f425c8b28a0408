"""Live serving statistics per model version: request counts, errors and latency percentiles over
recent time windows, for canary analysis (``window``) and the Prometheus export (``metrics``).

Prometheus histograms are cumulative since the process started; a canary step needs "errors and
p99 over the last 30 s", so this keeps its own ring of one-second buckets (counts and a
logarithmic latency histogram) per version, ~15 minutes of them. ``record`` is O(1) under one
lock; ``window`` merges at most ``KEEP_S`` buckets. Statistics are per process: with several API
servers each sees only the requests it answered (see docs/serving.md, "Serving").
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LATENCY_EDGES_MS", "MetricsSink", "ServingStats", "VersionWindow"]

#: Upper edges (ms) of the latency histogram: 0.1 ms to ~60 s, 12% apart (p99 within 12%).
LATENCY_EDGES_MS: tuple[float, ...] = tuple(0.1 * 1.12**k for k in range(118))
_LOG_BASE = math.log(1.12)
#: Seconds one bucket covers, and how many seconds of buckets are kept.
BUCKET_S = 1
KEEP_S = 900


class MetricsSink(Protocol):
    """Where every request is also exported
    (``aicluster.control.views.servingmetrics.ServingMetrics``)."""

    def observe(
        self, tenant: str, model: str, version: str, seconds: float, ok: bool, code: int = 200
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class VersionWindow:
    """What one version answered in a time window: requests, errors and the p99 latency (None
    when there were no requests)."""

    requests: int
    errors: int
    p99_ms: float | None
    latency_s: float = 0.0  # the requests' latencies summed (their mean, for Little's law)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def mean_latency_s(self) -> float:
        return self.latency_s / self.requests if self.requests else 0.0


class _Ring:
    """One version's buckets: slot ``second % KEEP_S`` holds that second's counts."""

    __slots__ = ("errors", "histograms", "latency_s", "requests", "seconds")

    def __init__(self) -> None:
        self.seconds = [-1] * KEEP_S
        self.requests = [0] * KEEP_S
        self.errors = [0] * KEEP_S
        self.latency_s = [0.0] * KEEP_S
        self.histograms: list[dict[int, int]] = [{} for _ in range(KEEP_S)]

    def add(self, second: int, ok: bool, latency_ms: float) -> None:
        slot = second % KEEP_S
        if self.seconds[slot] != second:  # a bucket from KEEP_S seconds ago: reuse it
            self.seconds[slot] = second
            self.requests[slot] = self.errors[slot] = 0
            self.latency_s[slot] = 0.0
            self.histograms[slot] = {}
        self.requests[slot] += 1
        self.errors[slot] += 0 if ok else 1
        self.latency_s[slot] += latency_ms / 1000.0
        histogram = self.histograms[slot]
        index = _bin(latency_ms)
        histogram[index] = histogram.get(index, 0) + 1


def _bin(latency_ms: float) -> int:
    if latency_ms <= LATENCY_EDGES_MS[0]:
        return 0
    return min(len(LATENCY_EDGES_MS) - 1, math.ceil(math.log(latency_ms / 0.1) / _LOG_BASE))


class ServingStats:
    """Time-bucketed request statistics per (tenant, model, version). Thread-safe.

    ``metrics`` (optional) also receives every request for the Prometheus export.
    """

    def __init__(self, metrics: MetricsSink | None = None) -> None:
        self.metrics = metrics
        self._rings: dict[tuple[str, str, int], _Ring] = {}
        self._lock = threading.Lock()

    def record(
        self,
        tenant: str,
        name: str,
        version: int,
        ok: bool,
        latency_s: float,
        now: float,
        code: int | None = None,
    ) -> None:
        """Count one answered request at time ``now`` (Unix seconds). O(1)."""
        key = (tenant, name, version)
        with self._lock:
            ring = self._rings.get(key)
            if ring is None:
                ring = self._rings[key] = _Ring()
            ring.add(int(now // BUCKET_S), ok, latency_s * 1000.0)
        if self.metrics is not None:
            code = code if code is not None else (200 if ok else 500)
            self.metrics.observe(tenant, name, str(version), latency_s, ok, code)

    def window(
        self, tenant: str, name: str, version: int, since: float, now: float
    ) -> VersionWindow:
        """Requests, errors and p99 of the buckets whose second lies in ``[since, now]``
        (whole seconds: a window is exact to one bucket). At most the last ``KEEP_S`` seconds."""
        first = max(int(since // BUCKET_S), int(now // BUCKET_S) - KEEP_S + 1)
        last = int(now // BUCKET_S)
        requests = errors = 0
        latency_s = 0.0
        merged: dict[int, int] = {}
        with self._lock:
            ring = self._rings.get((tenant, name, version))
            if ring is None:
                return VersionWindow(0, 0, None)
            for slot, second in enumerate(ring.seconds):
                if first <= second <= last:
                    requests += ring.requests[slot]
                    errors += ring.errors[slot]
                    latency_s += ring.latency_s[slot]
                    for index, count in ring.histograms[slot].items():
                        merged[index] = merged.get(index, 0) + count
        p99 = _percentile(merged, requests, 0.99)
        return VersionWindow(requests, errors, p99, latency_s)

    def forget(self, tenant: str, name: str, version: int | None = None) -> None:
        """Drop a version's (or every version's) statistics, e.g. when a deployment is deleted."""
        with self._lock:
            for key in [k for k in self._rings if k[:2] == (tenant, name)]:
                if version is None or key[2] == version:
                    del self._rings[key]


def _percentile(histogram: dict[int, int], total: int, quantile: float) -> float | None:
    if total == 0:
        return None
    rank = math.ceil(quantile * total)
    seen = 0
    for index in sorted(histogram):
        seen += histogram[index]
        if seen >= rank:
            return LATENCY_EDGES_MS[index]
    return LATENCY_EDGES_MS[-1]
