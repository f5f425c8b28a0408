"""``GET /metrics`` (Prometheus text format, bearer token required) and the API latency
middleware.

Who sees what: a cluster admin gets every series. Anyone else gets only the series labelled
with a tenant it has a role in; cluster-wide series (capacity, nodes, scheduling and API latency)
are left out, as another tenant's numbers would be. A Prometheus server scrapes with a cluster
admin's token (``authorization: {credentials_file: ...}`` in its scrape config).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aicluster.api.auth import CurrentPrincipal
from aicluster.control.views.metrics import PER_TENANT_FAMILIES, PlaneCollector
from aicluster.store import Principal

__all__ = ["ApiMetrics", "LatencyMiddleware", "router", "visible_families"]

router = APIRouter(tags=["metrics"])

#: API calls: a millisecond (a cached read) to seconds (a big listing).
API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
UNMATCHED = "<unmatched>"  # a path no route matched: never the raw path (unbounded labels)


class ApiMetrics:
    """The API's own series; one per app, so several apps in a process never mix them."""

    def __init__(self) -> None:
        self.latency = Histogram(
            "aicluster_api_request_seconds",
            "API request latency by route template and method.",
            ["method", "route"],
            buckets=API_BUCKETS,
            registry=None,
        )
        self.requests = Counter(
            "aicluster_api_requests",
            "API requests by route template, method and status code.",
            ["method", "route", "code"],
            registry=None,
        )

    def observe(self, method: str, route: str, code: int, seconds: float) -> None:
        self.latency.labels(method, route).observe(seconds)
        self.requests.labels(method, route, str(code)).inc()

    def collect(self) -> Iterator[Metric]:
        yield from self.latency.collect()
        yield from self.requests.collect()


class LatencyMiddleware:
    """Times every HTTP request and labels it with the route template that served it."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            elapsed = time.perf_counter() - started
            self.metrics.observe(scope["method"], _route_of(scope), status, elapsed)


def _route_of(scope: Scope) -> str:
    """The template (``/v1/jobs/{job_id}``) of the route the router matched; the router writes
    it into the shared scope."""
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else UNMATCHED


def visible_families(families: Iterable[Metric], principal: Principal) -> Iterator[Metric]:
    """The families as ``principal`` may see them: all for a cluster admin; otherwise only the
    per-tenant families, with only the samples of its tenants. A family not declared per
    tenant is hidden from tenants by default."""
    for family in families:
        if principal.cluster_admin:
            yield family
        elif family.name in PER_TENANT_FAMILIES:
            kept = Metric(family.name, family.documentation, family.type, family.unit)
            kept.samples = [
                sample
                for sample in family.samples
                if principal.role_in(sample.labels.get("tenant", "")) is not None
            ]
            yield kept


class _Snapshot:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def exposition(collector: PlaneCollector, principal: Principal) -> bytes:
    """The text format of what ``principal`` may see."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(list(visible_families(collector.collect(), principal))))
    return generate_latest(registry)


@router.get("/metrics", response_class=Response)
def metrics(request: Request, principal: CurrentPrincipal) -> Response:
    """Prometheus metrics (text format 0.0.4). Cluster admins see every series; other callers
    only their tenants' series."""
    collector: Any = request.app.state.metrics
    return Response(exposition(collector, principal), media_type=CONTENT_TYPE_LATEST)
