"""The audit record of every API call that changes state, written in one place.

:class:`AuditLog` wraps the whole application. For each call of a route with a method other than
GET, HEAD and OPTIONS that succeeds (status below 400) it appends one event to the store's log,
before the response leaves (a client that has its answer finds the record):

- ``kind``: ``api.<route name>`` (``api.submit_job``, ``api.cordon``);
- ``actor``: the caller's user (the token's, or ``local`` on a server without auth);
- ``tenant``: the tenant the route reported with :func:`audit_target`, else the path's or the
  query's ``tenant`` (None for cluster-wide calls: users, tokens, nodes);
- ``details``: ``method``, ``route`` (the path template), ``status``, ``outcome`` (``ok``, or
  ``unchanged`` for an idempotent retry the route recognized) and ``object`` (what the call
  acted on: the route's report, else the path's last parameter).

What the call changed is logged by the store as events of its own (``job.submitted``,
``rollout.started``, ...) next to this record. Failed calls (4xx, 5xx) leave no record; routes
that change nothing on the server (a prediction, the dashboard's sign-in) are marked with
:func:`not_audited`. Request bodies are never copied into the log (a job spec holds secrets).

On SQLite concurrent records share one transaction (as submissions do, :mod:`aicluster.store.
submit`): a commit per call would halve the API's submission rate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aicluster.api.auth import SAFE_METHODS
from aicluster.store import Principal, Store

__all__ = ["AuditLog", "audit_target", "not_audited"]

log = logging.getLogger(__name__)

#: Where a route's report (:func:`audit_target`) waits in ``request.state``.
_TARGET = "audit_target"
#: The attribute :func:`not_audited` sets on a route's endpoint: why it is not recorded.
NOT_AUDITED = "__not_audited__"
_MAX_BATCH = 256
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class AuditTarget:
    tenant: str | None = None
    object: str | None = None
    outcome: str | None = None


def audit_target(
    request: Request,
    *,
    tenant: str | None = None,
    object: str | None = None,
    outcome: str | None = None,
) -> None:
    """Say what this call acted on, for its audit record: the tenant (so that its members see
    the record), the object (a job id, a model name), and ``outcome="unchanged"`` for an
    idempotent call that changed nothing. Fields left None keep what the path says."""
    setattr(request.state, _TARGET, AuditTarget(tenant, object, outcome))


def not_audited(reason: str) -> Callable[[F], F]:
    """Mark a state-changing route whose calls change nothing on the server (so: no record)."""

    def mark(endpoint: F) -> F:
        setattr(endpoint, NOT_AUDITED, reason)
        return endpoint

    return mark


@dataclass(slots=True)
class _Record:
    kind: str
    actor: str
    tenant: str | None
    details: dict[str, Any]
    error: BaseException | None = None
    done: bool = False


@dataclass
class _Writer:
    """Appends records to ``plane.store`` (read at each write: a plane may get it late); on
    SQLite, records queued meanwhile go in the same transaction."""

    plane: Any
    _queue: list[_Record] = field(default_factory=list)
    _queue_lock: threading.Lock = field(default_factory=threading.Lock)
    _commit_lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, record: _Record) -> None:
        if self.plane.store.dialect != "sqlite":  # PostgreSQL groups concurrent flushes itself
            self._commit([record])
        else:
            with self._queue_lock:
                self._queue.append(record)
            while not record.done:
                with self._commit_lock:
                    if record.done:
                        break
                    with self._queue_lock:
                        batch = self._queue[:_MAX_BATCH]
                        del self._queue[:_MAX_BATCH]
                    self._commit(batch)
        if record.error is not None:
            raise record.error

    def _commit(self, batch: list[_Record]) -> None:
        try:
            store: Store = self.plane.store
            store.record_api_calls([(r.kind, r.actor, r.tenant, r.details) for r in batch])
        except Exception as error:  # every caller of the batch learns it
            for record in batch:
                record.error = error
        for record in batch:
            record.done = True


class AuditLog:
    """ASGI middleware: one audit record per successful state-changing call (module doc)."""

    def __init__(self, app: ASGIApp, plane: Any) -> None:
        self.app = app
        self.writer = _Writer(plane)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return

        async def record_then_send(message: Message) -> None:
            if message["type"] == "http.response.start" and int(message["status"]) < 400:
                record = _record_of(scope, int(message["status"]))
                if record is not None:
                    try:
                        await run_in_threadpool(self.writer.write, record)
                    except Exception:  # the change is committed: answer, and say so loudly
                        log.exception("the audit record of %s could not be written", record.kind)
            await send(message)

        await self.app(scope, receive, record_then_send)


def _record_of(scope: Scope, status: int) -> _Record | None:
    """The record of a call that succeeded; None for a route marked :func:`not_audited` (or a
    request no route served)."""
    route = scope.get("route")
    if route is None or hasattr(getattr(route, "endpoint", None), NOT_AUDITED):
        return None
    state = scope.get("state") or {}
    principal: Principal | None = state.get("principal")
    target: AuditTarget = state.get(_TARGET) or AuditTarget()
    params: dict[str, Any] = scope.get("path_params") or {}
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    tenant = target.tenant or params.get("tenant") or next(iter(query.get("tenant", [])), None)
    obj = target.object or (str(list(params.values())[-1]) if params else None)
    details = {
        "method": scope["method"],
        "route": str(getattr(route, "path", "")),
        "status": status,
        "outcome": target.outcome or "ok",
        "object": obj,
    }
    actor = principal.user if principal is not None else "anonymous"
    return _Record(f"api.{getattr(route, 'name', 'unknown')}"[:64], actor, tenant, details)
