"""The FastAPI application: routers, error handlers, the request-size guard."""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aicluster import __version__
from aicluster.api.auditlog import AuditLog
from aicluster.api.auth import PrincipalCache
from aicluster.api.errors import ReadableErrors, install_error_handlers
from aicluster.api.feasible import Feasibility, gpus_in_use
from aicluster.api.localonly import LocalOnly
from aicluster.api.metrics import ApiMetrics, LatencyMiddleware
from aicluster.api.metrics import router as metrics_router
from aicluster.api.ratelimit import Limits
from aicluster.api.routes import (
    admin,
    audit,
    cluster,
    code,
    config,
    data,
    jobs,
    models,
    pipelines,
    rollouts,
    serving,
    twin,
    ui,
    usage,
)
from aicluster.artifacts import code_store
from aicluster.artifacts.datasets import dataset_files
from aicluster.control.views.metrics import PlaneCollector
from aicluster.core import JobSpec

__all__ = ["create_app"]

#: POSTs that stream under caps of their own: code archives and dataset shards.
_UPLOADS = f"{code.UPLOAD_PATH}|{data.SHARD_PATH}"


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with 413, declared or streamed, before reading them;
    except POSTs to paths ``exempt`` matches whole, whose route streams under caps of its own."""

    def __init__(self, app: ASGIApp, limit: int, exempt: str | None = None) -> None:
        self.app, self.limit = app, limit
        self.exempt = re.compile(exempt) if exempt else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._exempt(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _too_large(self.limit)(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _BodyTooLarge:
            await _too_large(self.limit)(scope, receive, send)

    def _exempt(self, scope: Scope) -> bool:
        path = scope.get("path", "")
        return bool(self.exempt and scope.get("method") == "POST" and self.exempt.fullmatch(path))


class _BodyTooLarge(Exception):
    pass


def _too_large(limit: int) -> JSONResponse:
    return JSONResponse({"error": f"request body larger than {limit} bytes"}, status_code=413)


def create_app(plane: Any) -> FastAPI:
    """The API over a control plane (``aicluster.control.ControlPlane`` or a test double of the
    same shape): ``plane.store``, ``plane.settings``, ``plane.clock`` and its query methods."""
    app = FastAPI(
        title="aicluster",
        version=__version__,
        description="Submit, queue, place, run and watch training jobs on a shared GPU cluster.",
    )
    app.state.plane = plane
    app.state.principals = PrincipalCache(plane.settings.auth_cache_s, plane.clock)
    app.state.limits = Limits(plane.settings)
    app.state.code = code_store(plane.settings.state_dir)
    app.state.datasets = dataset_files(plane.settings.state_dir)
    app.state.feasibility = Feasibility(
        lambda: [r.node for r in plane.store.list_nodes()], lambda: gpus_in_use(plane.store)
    )
    install_error_handlers(app)
    app.include_router(jobs.router)
    app.include_router(models.router)
    app.include_router(code.router)
    app.include_router(data.router)
    app.include_router(data.policy_router)
    app.include_router(cluster.router)
    app.include_router(admin.router)
    app.include_router(serving.router)
    app.include_router(rollouts.router)
    app.include_router(pipelines.router)
    app.include_router(pipelines.everyone)
    app.include_router(audit.router)
    app.include_router(usage.router)
    app.include_router(config.router)
    app.include_router(twin.router)
    app.include_router(ui.router)
    app.include_router(ui.pages)
    app.include_router(metrics_router)
    api_metrics = ApiMetrics()
    app.state.metrics = PlaneCollector(plane, extra=[api_metrics])

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, Any]:
        """Liveness, without authentication."""
        return {
            "ok": True,
            "version": __version__,
            "leader": plane.is_leader(),
            "sandboxed": bool(plane.settings.sandbox),
            "resource_limits": str(getattr(plane, "resource_limits", "unknown")),
            "disk_limit": _disk_limit(plane),
        }

    _register_schema(app)
    app.add_middleware(AuditLog, plane=plane)  # one record per state-changing call
    app.add_middleware(BodyLimit, limit=plane.settings.max_body_bytes, exempt=_UPLOADS)
    app.add_middleware(LatencyMiddleware, metrics=api_metrics)
    if not plane.settings.auth:  # outermost: checked before anything else runs
        app.add_middleware(LocalOnly, port=plane.settings.port)
    app.add_middleware(ReadableErrors)  # around everything: no 4xx goes out without a body
    return app


def _disk_limit(plane: Any) -> str | None:
    """How a sandboxed job's disk cap is held here: "loop" (the kernel) or "poll"; None
    without sandboxed jobs."""
    runtime = getattr(plane, "runtime", None)
    sandbox = getattr(runtime, "sandbox", None)
    return str(sandbox.disk_limit) if sandbox is not None else None


def _register_schema(app: FastAPI) -> None:
    """Publish JobSpec in components (the submit route reads its body by hand for YAML)."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = original()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        spec_schema = JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in spec_schema.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components["JobSpec"] = spec_schema
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
