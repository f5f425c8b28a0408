"""Datasets: a tenant pushes a version (its shards, then its manifest), lists, shows and
deletes versions; a cluster admin sets the tenant's data quota and retention.

A push is streamed: each shard is one request whose body goes to a temporary file as it
arrives (hashed on the way; its SHA-256 must be the one its path names) and on to the data
store, never whole in memory. Shards and versions are per tenant: another tenant's name,
version or shard hash is not found (``aicluster.artifacts.storage`` keys start with the tenant).
"""

from __future__ import annotations

import hashlib
import tempfile
from typing import IO, Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import CurrentPrincipal, require_cluster_admin, require_role
from aicluster.api.params import TenantName
from aicluster.artifacts.datasets import DatasetFiles
from aicluster.artifacts.shards import MAX_SHARD_BYTES, check_manifest, manifest_hash
from aicluster.core.jobspec import CODE_HASH
from aicluster.store import DataPolicy, DataQuotaExceeded, Principal, Role, Store

__all__ = ["SHARD_PATH", "router"]

router = APIRouter(prefix="/v1/tenants/{tenant}/datasets", tags=["data"])

#: The shard upload's path, a regular expression to match whole (the body limit skips it).
SHARD_PATH = r"/v1/tenants/[^/]+/datasets/shards/[0-9a-f]{64}"

ShardHash = Annotated[str, Path(max_length=64, pattern=CODE_HASH)]
DatasetName = Annotated[str, Path(max_length=63, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
VersionRef = Annotated[str, Path(max_length=10, pattern=r"^(latest|[1-9][0-9]{0,8})$")]
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_SHARD_BODY = {"requestBody": {"required": True, "content": {"application/octet-stream": _BINARY}}}


class DataPolicyIn(BaseModel):
    quota_bytes: Annotated[int, Field(ge=0, le=1 << 62)] | None = None
    keep_versions: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    keep_days: Annotated[float, Field(gt=0, le=100_000)] | None = None


def _store(request: Request) -> Store:
    store: Store = request.app.state.plane.store
    return store


def _files(request: Request) -> DatasetFiles:
    files: DatasetFiles = request.app.state.datasets
    return files


def _may(request: Request, principal: Principal, tenant: str, role: Role) -> None:
    require_role(principal, tenant, role)
    _store(request).get_tenant(tenant)  # a cluster admin may name any: NotFound


def _quota(request: Request, tenant: str) -> int:
    policy = _store(request).data_policy(tenant)
    default: int = request.app.state.plane.settings.max_data_bytes_per_tenant
    return policy.quota_bytes if policy.quota_bytes is not None else default


@router.head("/shards/{sha256}")
def shard_exists(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, sha256: ShardHash
) -> Response:
    """200 when the tenant's data store holds that shard (one to skip), 404 when not."""
    require_role(principal, tenant, Role.VIEWER)
    found = _files(request).has_shard(tenant, sha256)
    return Response(status_code=200 if found else 404)


@router.post("/shards/{sha256}", status_code=201, openapi_extra=_SHARD_BODY)
async def upload_shard(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, sha256: ShardHash
) -> dict[str, Any]:
    """Store one shard (the body, streamed; member role). 400 when its bytes do not hash to
    ``sha256``, 413 over the shard cap or the tenant's data quota; then nothing is stored."""
    await run_in_threadpool(_may, request, principal, tenant, Role.MEMBER)
    quota = await run_in_threadpool(_quota, request, tenant)
    used = await run_in_threadpool(_store(request).data_usage, tenant)
    with tempfile.TemporaryFile(dir=_files(request).spool_dir()) as spool:
        size, digest = await _receive(request, spool, min(MAX_SHARD_BYTES, quota - used), quota)
        if digest != sha256:
            raise HTTPException(400, detail=f"the body's SHA-256 is {digest}, not {sha256}")
        spool.seek(0)
        await run_in_threadpool(_files(request).put_shard, tenant, sha256, spool)
    audit_target(request, tenant=tenant, object=sha256)
    return {"sha256": sha256, "size": size}


async def _receive(request: Request, spool: IO[bytes], cap: int, quota: int) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            over_quota = cap < MAX_SHARD_BYTES
            detail = (
                f"this shard would take the tenant past its data quota of {quota} bytes"
                if over_quota
                else f"a shard is larger than the cap of {MAX_SHARD_BYTES} bytes"
            )
            raise HTTPException(413, detail=detail)
        digest.update(chunk)
        spool.write(chunk)
    return size, digest.hexdigest()


@router.post("/{name}/versions", status_code=201)
def push_version(
    request: Request,
    principal: CurrentPrincipal,
    tenant: TenantName,
    name: DatasetName,
    manifest: dict[str, Any],
) -> dict[str, Any]:
    """Make the next version of ``name`` from a manifest whose shards the tenant has uploaded
    (member role); then the tenant's retention runs. 400 for a bad manifest or a missing
    shard, 413 over the data quota."""
    _may(request, principal, tenant, Role.MEMBER)
    checked = check_manifest(manifest)
    files = _files(request)
    missing = [s["sha256"] for s in checked["shards"] if not files.has_shard(tenant, s["sha256"])]
    if missing:
        raise HTTPException(400, detail=f"shards not uploaded for tenant {tenant!r}: {missing[0]}")
    digest = manifest_hash(checked)
    files.put_manifest(tenant, digest, checked)
    default = request.app.state.plane.settings.max_data_bytes_per_tenant
    try:
        record, removed = _store(request).create_dataset_version(
            tenant, name, checked, digest, principal.user, default_quota=default
        )
    except DataQuotaExceeded as error:
        raise HTTPException(413, detail=str(error)) from None
    files.delete_shards(tenant, removed.shards)
    audit_target(request, tenant=tenant, object=record.ref)
    return {**_summary(record), "removed": list(removed.versions)}


@router.get("")
def list_versions(request: Request, principal: CurrentPrincipal, tenant: TenantName) -> Any:
    """The tenant's dataset versions, newest first per name (viewer role)."""
    require_role(principal, tenant, Role.VIEWER)
    store = _store(request)
    versions = [_summary(r) for r in store.list_dataset_versions(tenant)]
    return {"versions": versions, "bytes_stored": store.data_usage(tenant)}


@router.get("/{name}/versions/{version}")
def show_version(
    request: Request,
    principal: CurrentPrincipal,
    tenant: TenantName,
    name: DatasetName,
    version: VersionRef,
) -> dict[str, Any]:
    """One version: its files, shards, bytes, who pushed it when, the jobs that read it and the
    model versions trained on it."""
    require_role(principal, tenant, Role.VIEWER)
    number = None if version == "latest" else int(version)
    record = _store(request).get_dataset_version(tenant, name, number)
    files = [{"path": f["path"], "size": f["size"]} for f in record.manifest["files"]]
    return {
        **_summary(record),
        "files_list": files,
        "shards_list": record.manifest["shards"],
        "used_by": list(record.used_by),
        "models": _store(request).models_from_dataset(tenant, name, record.version),
    }


@router.delete("/{name}/versions/{version}", status_code=204)
def delete_version(
    request: Request,
    principal: CurrentPrincipal,
    tenant: TenantName,
    name: DatasetName,
    version: Annotated[int, Path(ge=1, le=999_999_999)],
) -> Response:
    """Delete a version (member role; admin role when a model's lineage names it, which then
    shows it as deleted); 409 while a job that has not finished reads it."""
    _may(request, principal, tenant, Role.MEMBER)
    models = _store(request).models_from_dataset(tenant, name, version)
    if models and not principal.can(tenant, Role.ADMIN):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"{name}:{version} is in the lineage of {', '.join(models[:5])}: "
            "only a tenant admin may delete it",
        )
    removed = _store(request).delete_dataset_version(tenant, name, version, principal.user)
    _files(request).delete_shards(tenant, removed.shards)
    audit_target(request, tenant=tenant, object=f"{name}:{version}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)


policy_router = APIRouter(prefix="/v1/tenants/{tenant}/data-policy", tags=["data"])


@policy_router.get("")
def get_policy(request: Request, principal: CurrentPrincipal, tenant: TenantName) -> Any:
    """The tenant's data quota (bytes; the server default where it sets none) and retention."""
    require_role(principal, tenant, Role.VIEWER)
    policy = _store(request).data_policy(tenant)
    return {**vars(policy), "quota_bytes": _quota(request, tenant)}


@policy_router.put("")
def put_policy(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, body: DataPolicyIn
) -> Any:
    """Set the tenant's data quota and retention (cluster admin)."""
    require_cluster_admin(principal)
    policy = DataPolicy(body.quota_bytes, body.keep_versions, body.keep_days)
    _store(request).set_data_policy(tenant, policy, principal.user)
    audit_target(request, tenant=tenant, object="data-policy")
    return vars(policy)


def _summary(record: Any) -> dict[str, Any]:
    return {
        "name": record.name,
        "version": record.version,
        "manifest_sha256": record.manifest_sha256,
        "bytes": record.bytes,
        "files": record.files,
        "shards": record.shards,
        "pushed_by": record.pushed_by,
        "pushed_at": record.pushed_at,
    }
