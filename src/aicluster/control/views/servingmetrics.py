"""Model serving's Prometheus metrics, observed as requests are answered: counts, errors,
latency and traffic weight per model version (exported by
:mod:`aicluster.control.views.metrics`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

__all__ = ["SERVING", "SERVING_BUCKETS", "ServingMetrics"]

#: Model serving latency: from a millisecond to a slow generation.
SERVING_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_SERVING_LABELS = ("tenant", "model", "version")


class ServingMetrics:
    """Request counts, errors, latency and traffic weight per model version.

    The serving layer calls :meth:`observe` per request and :meth:`set_traffic` when a rollout
    moves traffic; the API exports them with the other metrics and the dashboard's deployment
    view reads :meth:`versions`. Thread-safe (prometheus_client metrics are).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "aicluster_serving_requests",
            "Requests answered per model version.",
            _SERVING_LABELS,
            registry=self.registry,
        )
        self.responses = Counter(
            "aicluster_serving_responses",
            "Requests answered per model version and HTTP status code.",
            (*_SERVING_LABELS, "code"),
            registry=self.registry,
        )
        self.errors = Counter(
            "aicluster_serving_errors",
            "Requests that failed per model version.",
            _SERVING_LABELS,
            registry=self.registry,
        )
        self.latency = Histogram(
            "aicluster_serving_request_seconds",
            "Request latency per model version.",
            _SERVING_LABELS,
            buckets=SERVING_BUCKETS,
            registry=self.registry,
        )
        self.traffic = Gauge(
            "aicluster_serving_traffic_weight",
            "Share of a model's traffic routed to this version (0..1).",
            _SERVING_LABELS,
            registry=self.registry,
        )
        self._known: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def observe(
        self, tenant: str, model: str, version: str, seconds: float, ok: bool, code: int = 200
    ) -> None:
        labels = (tenant, model, version)
        self._remember(labels)
        self.requests.labels(*labels).inc()
        self.responses.labels(*labels, str(code)).inc()
        self.latency.labels(*labels).observe(seconds)
        if not ok:
            self.errors.labels(*labels).inc()

    def set_traffic(self, tenant: str, model: str, version: str, weight: float) -> None:
        labels = (tenant, model, version)
        self._remember(labels)
        self.traffic.labels(*labels).set(weight)

    def _remember(self, labels: tuple[str, str, str]) -> None:
        with self._lock:
            if labels not in self._known:
                self._known.add(labels)
                self.errors.labels(*labels)  # so error rate reads 0, not missing

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()

    def versions(self) -> list[dict[str, Any]]:
        """Per model version: traffic weight, requests, errors and latency buckets so far."""
        rows: dict[tuple[str, ...], dict[str, Any]] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                key = tuple(sample.labels.get(name, "") for name in _SERVING_LABELS)
                row = rows.setdefault(key, dict(zip(_SERVING_LABELS, key, strict=True)))
                row.setdefault("buckets", [])
                if sample.name == "aicluster_serving_requests_total":
                    row["requests"] = sample.value
                elif sample.name == "aicluster_serving_errors_total":
                    row["errors"] = sample.value
                elif sample.name == "aicluster_serving_traffic_weight":
                    row["traffic"] = sample.value
                elif sample.name == "aicluster_serving_request_seconds_bucket":
                    row["buckets"].append([sample.labels["le"], sample.value])
        return sorted(rows.values(), key=lambda row: (row["tenant"], row["model"], row["version"]))


#: The process's serving metrics (a server process serves one control plane).
SERVING = ServingMetrics()
