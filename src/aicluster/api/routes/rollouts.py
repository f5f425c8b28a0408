"""Canary rollouts of a served model: start, list, show (with its events), promote, abort.

Members start and end rollouts; any role in the tenant may read them. Another tenant's model is a
404, as everywhere. The leader's rollout controller (``aicluster.serve.rollout``) moves running
rollouts along; these routes only write the decision and the traffic, then nudge the server.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import BaseModel, Field, model_validator

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import CurrentPrincipal, require_role
from aicluster.api.params import NAME_PATTERN, TenantFilter
from aicluster.api.routes.serving import _visible
from aicluster.serve.rollout import abort, check_plan, promote, start_rollout
from aicluster.store import NotFound, Principal, Role, RolloutRecord

__all__ = ["RolloutIn", "RolloutOut", "router"]

router = APIRouter(prefix="/v1/models", tags=["rollouts"])
ModelName = Annotated[str, Path(max_length=63, pattern=NAME_PATTERN)]
RolloutId = Annotated[int, Path(ge=1, le=2**62)]


class RolloutIn(BaseModel):
    """``aicluster rollout NAME:VERSION``: the plan and the health limits."""

    version: int = Field(ge=1, le=1_000_000)
    steps: list[int] = Field(default=[10, 25, 50, 100], min_length=1, max_length=100)
    interval_s: float = Field(default=30.0, description="seconds each step is held and judged")
    max_error_rate: float = Field(default=0.01, description="a fraction: 0.01 is 1%")
    max_p99_ms: float = Field(default=500.0)

    @model_validator(mode="after")
    def _plan(self) -> RolloutIn:
        problems = check_plan(self.steps, self.interval_s, self.max_error_rate, self.max_p99_ms)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class RolloutOut(BaseModel):
    id: int
    tenant: str
    name: str
    from_version: int
    to_version: int
    steps: list[int]
    step_index: int = Field(description="-1 while the new version's replicas start")
    weight: int = Field(description="the new version's percent of traffic now")
    interval_s: float
    max_error_rate: float
    max_p99_ms: float
    state: str
    reason: str | None
    step_started_at: float
    created_by: str
    created_at: float
    updated_at: float
    live: dict[str, Any] | None = Field(
        default=None, description="the new version's requests, errors and p99 this step so far"
    )
    events: list[dict[str, Any]] | None = None

    @classmethod
    def of(cls, record: RolloutRecord, **extra: Any) -> RolloutOut:
        return cls(tenant=record.tenant, **record.to_dict(), **extra)


def _changed(request: Request) -> None:
    serving = getattr(request.app.state.plane, "serving", None)
    if serving is not None:
        serving.changed()


@router.post("/{name}/rollouts", status_code=201)
def create_rollout(
    request: Request,
    principal: CurrentPrincipal,
    name: ModelName,
    body: RolloutIn,
    tenant: TenantFilter = None,
) -> RolloutOut:
    """Start rolling ``version`` out over the version now taking all traffic: it starts at 0%
    until its replicas serve, then takes each step's share for ``interval_s``; healthy steps
    advance, an unhealthy one sends all traffic back at once. 409 while another is running."""
    deployment = _visible(request, principal, name, tenant)
    require_role(principal, deployment.tenant, Role.MEMBER)
    audit_target(request, tenant=deployment.tenant)
    try:
        record = start_rollout(
            request.app.state.plane.store,
            deployment.tenant,
            name,
            version=body.version,
            steps=body.steps,
            interval_s=body.interval_s,
            max_error_rate=body.max_error_rate,
            max_p99_ms=body.max_p99_ms,
            actor=principal.user,
        )
    except ValueError as error:
        raise HTTPException(422, detail=str(error)) from None
    _changed(request)
    return RolloutOut.of(record)


@router.get("/{name}/rollouts")
def list_rollouts(
    request: Request, principal: CurrentPrincipal, name: ModelName, tenant: TenantFilter = None
) -> list[RolloutOut]:
    """The model's rollouts, newest first."""
    deployment = _visible(request, principal, name, tenant)
    store = request.app.state.plane.store
    return [RolloutOut.of(r) for r in store.list_rollouts(deployment.tenant, name)]


@router.get("/{name}/rollouts/{rollout_id}")
def get_rollout(
    request: Request,
    principal: CurrentPrincipal,
    name: ModelName,
    rollout_id: RolloutId,
    tenant: TenantFilter = None,
) -> RolloutOut:
    """One rollout with its events (each step, with the figures that justified it) and, while
    it runs, the new version's live figures for the current step."""
    deployment = _visible(request, principal, name, tenant)
    store = request.app.state.plane.store
    record = store.get_rollout(deployment.tenant, rollout_id)
    if record.name != name:
        raise NotFound(f"no rollout {rollout_id} of {name!r}")
    events = [
        {"at": e.at, "kind": e.kind, "actor": e.actor, "details": e.details}
        for e in store.rollout_events(record)
    ]
    return RolloutOut.of(record, live=_live(request, record), events=events)


def _live(request: Request, record: RolloutRecord) -> dict[str, Any] | None:
    serving = getattr(request.app.state.plane, "serving", None)
    if serving is None or record.state != "running" or record.step_index < 0:
        return None
    now = request.app.state.plane.clock.now()
    window = serving.stats.window(
        record.tenant, record.name, record.to_version, record.step_started_at, now
    )
    return {"requests": window.requests, "errors": window.errors, "p99_ms": window.p99_ms}


@router.post("/{name}/rollouts/current/promote")
def promote_rollout(
    request: Request, principal: CurrentPrincipal, name: ModelName, tenant: TenantFilter = None
) -> RolloutOut:
    """Send all traffic to the new version now (the old one drains and is removed)."""
    return _finish(request, principal, name, tenant, promote)


@router.post("/{name}/rollouts/current/abort")
def abort_rollout(
    request: Request, principal: CurrentPrincipal, name: ModelName, tenant: TenantFilter = None
) -> RolloutOut:
    """Send all traffic back to the old version now."""
    return _finish(request, principal, name, tenant, abort)


def _finish(
    request: Request, principal: Principal, name: str, tenant: str | None, action: Any
) -> RolloutOut:
    deployment = _visible(request, principal, name, tenant)
    require_role(principal, deployment.tenant, Role.MEMBER)
    audit_target(request, tenant=deployment.tenant)
    record = action(request.app.state.plane.store, deployment.tenant, name, principal.user)
    _changed(request)
    return RolloutOut.of(record)
