"""Continuous-learning pipelines: create, list, show (with runs), pause, resume, delete.

Members create and change a tenant's pipelines; any role in it reads them; another tenant's
pipeline is a 404. The spec is checked as a submit would check its job (shipped code, datasets)
and must name a deployment of the tenant. The leader's driver
(:mod:`aicluster.control.learning.pipelines`) fires them and moves their runs along.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Request, Response, status
from pydantic import BaseModel, ValidationError

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import CurrentPrincipal, require_role
from aicluster.api.params import NAME_PATTERN, TenantName
from aicluster.api.routes.jobs import _resolved_data, _shipped
from aicluster.core import jobspec_from_mapping
from aicluster.core.pipelines import Memory, PipelineSpec
from aicluster.store import NotFound, Principal, Role, Store
from aicluster.store.pipelines import PipelineRecord, PipelineRunRecord

__all__ = ["everyone", "router"]

router = APIRouter(prefix="/v1/tenants/{tenant}/pipelines", tags=["pipelines"])
everyone = APIRouter(prefix="/v1/pipelines", tags=["pipelines"])
PipelineName = Annotated[str, Path(max_length=63, pattern=NAME_PATTERN)]


class PipelineRunOut(BaseModel):
    id: int
    state: str
    reasons: list[str]
    job_id: str | None
    model_version: int | None
    rollout_id: int | None
    detail: str | None
    started_at: float
    ended_at: float | None

    @classmethod
    def of(cls, run: PipelineRunRecord) -> PipelineRunOut:
        fields = {k: v for k, v in vars(run).items() if k not in ("pipeline_id", "tenant")}
        return cls(**{**fields, "reasons": list(run.reasons)})


class PipelineOut(BaseModel):
    tenant: str
    name: str
    deployment: str
    paused: bool
    triggers: list[str]
    spec: dict[str, Any]
    created_by: str
    created_at: float
    runs: list[PipelineRunOut]

    @classmethod
    def of(cls, record: PipelineRecord, runs: list[PipelineRunRecord]) -> PipelineOut:
        spec = PipelineSpec.model_validate(record.spec)
        return cls(
            tenant=record.tenant,
            name=record.name,
            deployment=spec.deployment,
            paused=record.paused,
            triggers=spec.triggers.names(),
            spec=dict(record.spec),
            created_by=record.created_by,
            created_at=record.created_at,
            runs=[PipelineRunOut.of(run) for run in runs],
        )


def _store(request: Request) -> Store:
    store: Store = request.app.state.plane.store
    return store


def _out(store: Store, record: PipelineRecord, runs: int = 20) -> PipelineOut:
    return PipelineOut.of(record, store.pipeline_runs(record.id, limit=runs))


def _parse(request: Request, tenant: str, body: dict[str, Any]) -> PipelineSpec:
    """The spec, checked as a submit checks its job; 422 (bad fields) or 400 (missing code,
    dataset or deployment) with the reason."""
    if body.get("tenant") not in (None, tenant):
        named = body["tenant"]
        raise HTTPException(422, detail=f"tenant: the spec names {named!r}, not {tenant!r}")
    job = jobspec_from_mapping(body.get("job"), "job")  # JobSpecError: 422 with fields and lines
    job = _shipped(request.app.state.code, tenant, job.with_tenant(tenant))
    store = _store(request)
    _resolved_data(store, tenant, job)
    try:
        spec = PipelineSpec.model_validate({**body, "tenant": tenant, "job": job.canonical_dict()})
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "spec"
        raise HTTPException(422, detail=f"{where}: {first['msg']}") from None
    try:
        store.get_deployment(tenant, spec.deployment)
    except NotFound:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            detail=f"deployment: tenant {tenant!r} serves no model {spec.deployment!r} "
            "(aicluster serve NAME:VERSION first)",
        ) from None
    return spec


@router.post("", status_code=201)
def create_pipeline(
    request: Request,
    principal: CurrentPrincipal,
    tenant: TenantName,
    body: Annotated[dict[str, Any], Body()],
) -> PipelineOut:
    """Create a pipeline (member role). It fires only on what happens from now on: the
    datasets' current versions count as seen."""
    require_role(principal, tenant, Role.MEMBER)
    spec = _parse(request, tenant, body)
    store = _store(request)
    newest = {}
    for name in spec.triggers.new_data:
        newest[name] = store.get_dataset_version(tenant, name).version
    memory = Memory(seen=newest, last_fired=request.app.state.plane.clock.now())
    record = store.create_pipeline(
        tenant, spec.name, spec.model_dump(mode="json"), memory.to_json(), principal.user
    )
    audit_target(request, tenant=tenant, object=spec.name)
    return _out(store, record)


@router.get("")
def list_pipelines(
    request: Request, principal: CurrentPrincipal, tenant: TenantName
) -> list[PipelineOut]:
    """The tenant's pipelines, each with its last 5 runs (viewer role)."""
    require_role(principal, tenant, Role.VIEWER)
    store = _store(request)
    return [_out(store, record, 5) for record in store.list_pipelines(tenant)]


@router.get("/{name}")
def show_pipeline(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, name: PipelineName
) -> PipelineOut:
    """One pipeline with its last 20 runs (viewer role)."""
    require_role(principal, tenant, Role.VIEWER)
    store = _store(request)
    return _out(store, store.get_pipeline(tenant, name))


@router.post("/{name}/pause")
def pause_pipeline(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, name: PipelineName
) -> PipelineOut:
    """Stop firing (a run in progress goes on) (member role)."""
    return _set_paused(request, principal, tenant, name, True)


@router.post("/{name}/resume")
def resume_pipeline(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, name: PipelineName
) -> PipelineOut:
    """Fire again when a trigger holds (member role)."""
    return _set_paused(request, principal, tenant, name, False)


def _set_paused(
    request: Request, principal: Principal, tenant: str, name: str, paused: bool
) -> PipelineOut:
    require_role(principal, tenant, Role.MEMBER)
    store = _store(request)
    record = store.set_pipeline_paused(tenant, name, paused, principal.user)
    audit_target(request, tenant=tenant, object=name)
    return _out(store, record)


@router.delete("/{name}", status_code=204)
def delete_pipeline(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, name: PipelineName
) -> Response:
    """Delete a pipeline (member role); a job or canary it started goes on by itself."""
    require_role(principal, tenant, Role.MEMBER)
    _store(request).delete_pipeline(tenant, name, principal.user)
    audit_target(request, tenant=tenant, object=name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@everyone.get("")
def every_pipeline(request: Request, principal: CurrentPrincipal) -> list[PipelineOut]:
    """Every pipeline the caller can see, each with its last 5 runs (the dashboard's view)."""
    store = _store(request)
    if principal.cluster_admin:
        records = store.list_pipelines(None)
    else:
        records = [p for tenant in sorted(principal.roles) for p in store.list_pipelines(tenant)]
    return [_out(store, record, 5) for record in records]
