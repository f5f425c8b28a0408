"""The model registry: list models, show versions and their lineage, register from a job.

Models belong to a tenant; one name may exist in several tenants. A caller names the tenant
with ``?tenant=``, or leaves it out when only one of the tenants it can see has that model.
Another tenant's model or job answers 404, as if it did not exist.
"""

from __future__ import annotations

from contextlib import suppress

from fastapi import APIRouter, HTTPException, Request, status

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import CurrentPrincipal, require_role
from aicluster.api.params import ModelName, ModelVersion, TenantFilter
from aicluster.api.routes.jobs import visible_job
from aicluster.api.schemas import ModelOut, ModelRegisterIn, ModelVersionOut
from aicluster.control.learning.registry import NoExport, register_job_model, snapshot_export
from aicluster.core import JobState
from aicluster.store import ModelVersionRecord, NotFound, Principal, Role, Store

__all__ = ["router"]

router = APIRouter(prefix="/v1/models", tags=["models"])


def _store(request: Request) -> Store:
    store: Store = request.app.state.plane.store
    return store


def _visible_models(
    store: Store, principal: Principal, tenant: str | None
) -> list[ModelVersionRecord]:
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
        return store.list_models(tenant)
    if principal.cluster_admin:
        return store.list_models(None)
    return [model for name in sorted(principal.roles) for model in store.list_models(name)]


def _tenant_of(store: Store, principal: Principal, name: str, tenant: str | None) -> str:
    """The tenant whose model ``name`` the caller means; 404 when none it can see has one."""
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
        return tenant
    owners = sorted({m.tenant for m in _visible_models(store, principal, None) if m.name == name})
    if not owners:
        raise NotFound(f"no model {name!r}")
    if len(owners) > 1:
        raise HTTPException(
            422, detail=f"model {name!r} exists in tenants {', '.join(owners)}: pass ?tenant="
        )
    return owners[0]


def _with_lineage(store: Store, record: ModelVersionRecord) -> ModelVersionOut:
    """The version's view with its lineage: the training job's spec and shipped code (the job
    may be gone), the datasets it read, its share of the deployment's traffic."""
    job_code = spec = None
    with suppress(NotFound):
        if record.job_id is not None:
            job = store.get_job(record.tenant, record.job_id)
            job_code, spec = job.spec.code, job.spec.canonical_dict()
    lineage = store.model_lineage(record.tenant, record.name, record.version)
    return ModelVersionOut.of(record, job_code, lineage, spec)


@router.get("")
def list_models(
    request: Request, principal: CurrentPrincipal, tenant: TenantFilter = None
) -> list[ModelOut]:
    """Every model the caller can see (or one tenant's), with its latest version."""
    return [ModelOut.of(m) for m in _visible_models(_store(request), principal, tenant)]


@router.get("/{name}")
def model_versions(
    request: Request, principal: CurrentPrincipal, name: ModelName, tenant: TenantFilter = None
) -> list[ModelVersionOut]:
    """A model's versions, oldest first."""
    store = _store(request)
    owner = _tenant_of(store, principal, name, tenant)
    return [_with_lineage(store, v) for v in store.list_model_versions(owner, name)]


@router.get("/{name}/versions/{version}")
def model_version(
    request: Request,
    principal: CurrentPrincipal,
    name: ModelName,
    version: ModelVersion,
    tenant: TenantFilter = None,
) -> ModelVersionOut:
    """One version's lineage: job and its spec, code version, the datasets it read (deleted
    ones marked), parent model, metrics, who, when, and its share of the deployment's traffic."""
    store = _store(request)
    owner = _tenant_of(store, principal, name, tenant)
    return _with_lineage(store, store.get_model_version(owner, name, version))


@router.post("/{name}/versions", status_code=201)
def register_version(
    request: Request, principal: CurrentPrincipal, name: ModelName, body: ModelRegisterIn
) -> ModelVersionOut:
    """Register a SUCCEEDED job's export as the next version of ``name`` in the job's tenant
    (member role). Idempotent: the same job and name return the version registered before."""
    job = visible_job(request, principal, body.job_id)
    require_role(principal, job.tenant, Role.MEMBER)
    if job.state is not JobState.SUCCEEDED:
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"job {job.id} is {job.state.value}, not SUCCEEDED"
        )
    try:
        with snapshot_export(request.app.state.plane.settings.state_dir, job.id) as source:
            try:
                record = register_job_model(
                    _store(request), job, source, name=name, registered_by=principal.user
                )
            except ValueError as error:
                problem = str(error).replace(str(source), "export")  # no server paths
                raise HTTPException(422, f"the job's export is not valid: {problem}") from None
    except NoExport:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"job {job.id} exported no model (aicluster.train.export.export_model)",
        ) from None
    except ValueError as error:
        raise HTTPException(422, f"the job's export is not valid: {error}") from None
    audit_target(request, tenant=job.tenant, object=f"{name}:{record.version}")
    return _with_lineage(_store(request), record)
