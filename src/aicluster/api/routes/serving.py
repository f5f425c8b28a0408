"""Model serving: deployments (create, scale, rolling update, list, delete) and predictions.

``POST /v1/models/{name}/predict`` is the hot path: it is async, authenticates from the
principal cache when it can, and reads only the gateway's in-memory view (no database access
per request). Any role in a tenant may predict; members deploy. Another tenant's model is a 404.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from aicluster.api.auditlog import audit_target, not_audited
from aicluster.api.auth import (
    CurrentPrincipal,
    cached_principal,
    current_principal,
    require_role,
)
from aicluster.api.params import ModelName, TenantFilter
from aicluster.api.schemas import DeploymentIn, DeploymentOut
from aicluster.configuration import ServingSection
from aicluster.serve.services import replica_spec
from aicluster.store import DeploymentRecord, NotFound, Principal, Role

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["serving"])

_SERVING_OFF = HTTPException(
    status.HTTP_503_SERVICE_UNAVAILABLE,
    detail="model serving is not enabled on this server (start it with a Ray address)",
)


def _deploy_tenant(principal: Principal, wanted: str | None) -> str:
    if wanted:
        return wanted
    tenants = [t for t, role in principal.roles.items() if role.allows(Role.MEMBER)]
    if len(tenants) == 1:
        return tenants[0]
    raise HTTPException(422, detail="tenant: say which tenant the deployment is for")


def _out(request: Request, record: DeploymentRecord) -> DeploymentOut:
    serving = getattr(request.app.state.plane, "serving", None)
    healthy = {
        version: serving.gateway.healthy_replicas(record.tenant, record.name, version)
        for version in record.versions
        if serving is not None
    }
    return DeploymentOut.of(record, healthy, str(request.base_url))


def _changed(request: Request) -> None:
    """Route by the change at once on this server (without serving here, the leader's
    deployer and the other servers' gateways pick it up within a refresh)."""
    serving = getattr(request.app.state.plane, "serving", None)
    if serving is not None:
        serving.changed()


@router.post("/deployments", status_code=200)
def put_deployment(
    request: Request, principal: CurrentPrincipal, body: DeploymentIn
) -> DeploymentOut:
    """Serve ``model:version``. A new deployment sends it all traffic; a version already taking
    all traffic is rescaled; any other version is a rolling update: it is deployed alongside,
    takes all traffic once healthy, and the old versions drain and are removed."""
    tenant = _deploy_tenant(principal, body.tenant)
    require_role(principal, tenant, Role.MEMBER)
    store = request.app.state.plane.store
    scaling, (cpus, memory_gb) = body.scaling(), body.replica_host()
    _check_replica_fits(request, tenant, body)
    try:
        current = store.get_deployment(tenant, body.model)
    except NotFound:
        current = None
    if current is None or current.traffic == {body.version: 100.0}:
        traffic: dict[int, float] = {body.version: 100.0}
    else:  # a rolling update: the new version joins at 0% and takes over when healthy
        traffic = {**current.traffic, body.version: current.traffic.get(body.version, 0.0)}
        scaling["promote_when_healthy"] = body.version
    record = store.put_deployment(
        tenant, body.model, scaling, traffic, principal.user, cpus=cpus, memory_gb=memory_gb
    )
    audit_target(request, tenant=tenant, object=body.model)
    _changed(request)
    return _out(request, record)


def _check_replica_fits(request: Request, tenant: str, body: DeploymentIn) -> None:
    """A replica is a job: refuse one no node could ever hold (400), as a job's submit does,
    rather than leave it waiting forever."""
    holds = (body.gpus or 0, *body.replica_host())
    spec = replica_spec(tenant, body.model, body.version, holds, ServingSection())
    never = request.app.state.feasibility.refusal(spec.to_job("replica", 0.0))
    if never is not None:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            detail=f"no node of this cluster can ever hold a replica: {never}",
        )


@router.get("/deployments")
def list_deployments(
    request: Request, principal: CurrentPrincipal, tenant: TenantFilter = None
) -> list[DeploymentOut]:
    """Deployments of the caller's tenants (or of ``tenant``)."""
    store = request.app.state.plane.store
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
        records = store.list_deployments(tenant)
    else:
        records = [
            d for d in store.list_deployments(None) if principal.role_in(d.tenant) is not None
        ]
    return [_out(request, record) for record in records]


def _visible(request: Request, principal: Principal, name: str, tenant: str | None) -> Any:
    store = request.app.state.plane.store
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
        return store.get_deployment(tenant, name)
    found = [
        d
        for d in store.list_deployments(None)
        if d.name == name and principal.role_in(d.tenant) is not None
    ]
    if not found:
        raise NotFound(f"no deployment {name!r}")
    if len(found) > 1:
        raise HTTPException(422, detail=f"several tenants serve {name!r}: add ?tenant=")
    return found[0]


@router.get("/deployments/{name}")
def get_deployment(
    request: Request, principal: CurrentPrincipal, name: ModelName, tenant: TenantFilter = None
) -> DeploymentOut:
    return _out(request, _visible(request, principal, name, tenant))


@router.delete("/deployments/{name}", status_code=204)
def delete_deployment(
    request: Request, principal: CurrentPrincipal, name: ModelName, tenant: TenantFilter = None
) -> Response:
    """Stop serving a model: its replicas drain and are removed."""
    record = _visible(request, principal, name, tenant)
    require_role(principal, record.tenant, Role.MEMBER)
    audit_target(request, tenant=record.tenant)
    request.app.state.plane.store.delete_deployment(record.tenant, name, principal.user)
    _changed(request)
    return Response(status_code=204)


@router.post(
    "/models/{name}/predict",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
)
@not_audited("a prediction changes nothing, and a write per request would slow serving")
async def predict(request: Request, name: ModelName, tenant: TenantFilter = None) -> Response:
    """Run the model on a JSON object; answers ``{"model", "version", "outputs"}``. 404 for a
    model the caller cannot see, 422 for bad input, 503 when no replica is healthy (retry),
    504 when the model does not answer in time."""
    principal = cached_principal(request)
    if principal is None:  # a cache miss asks the store: off the event loop
        principal = await run_in_threadpool(current_principal, request)
    serving = getattr(request.app.state.plane, "serving", None)
    if serving is None:  # rare: an API-only server; answer as one with serving would
        served = await run_in_threadpool(_tenants_in_store, request, name)
        _model_tenant(principal, served, name, tenant)
        raise _SERVING_OFF
    gateway = serving.gateway
    owner = _model_tenant(principal, gateway.tenants_serving(name), name, tenant)
    try:
        inputs = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise HTTPException(422, detail="the body must be a JSON object") from None
    if not isinstance(inputs, dict):
        raise HTTPException(422, detail="the body must be a JSON object")
    answer = await gateway.predict(owner, name, inputs)
    headers = {"Retry-After": "1"} if answer.status == 503 else None
    return JSONResponse(answer.body, status_code=answer.status, headers=headers)


def _tenants_in_store(request: Request, name: str) -> list[str]:
    store = request.app.state.plane.store
    return [d.tenant for d in store.list_deployments(None) if d.name == name]


def _model_tenant(principal: Principal, served: list[str], name: str, tenant: str | None) -> str:
    """The tenant whose ``name`` the caller means: 404 unless it may see one serving it."""
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
        if tenant not in served:
            raise HTTPException(404, detail=f"no deployment {name!r}")
        return tenant
    serving = [t for t in served if principal.role_in(t) is not None]
    if not serving:
        raise HTTPException(404, detail=f"no deployment {name!r}")
    if len(serving) > 1:
        raise HTTPException(422, detail=f"several tenants serve {name!r}: add ?tenant=")
    return str(serving[0])
