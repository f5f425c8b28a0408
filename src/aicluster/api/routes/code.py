"""Shipped code: a tenant uploads the archive of its job's code (``aicluster submit`` does), and
a job's spec names it by SHA-256 (``code``).

The upload is streamed to the code store under its own cap (``max_code_upload_bytes``; the
server's 1 MiB body limit does not apply to this route) and the tenant's total
(``max_code_bytes_per_tenant``). Archives are per tenant: another tenant's hash is not found.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import CurrentPrincipal, require_role
from aicluster.api.params import TenantName
from aicluster.api.schemas import CodeOut, CodeStoredOut
from aicluster.artifacts import CodeNotFound, CodeStore, CodeTooLarge, CodeTreeError
from aicluster.core.jobspec import CODE_HASH
from aicluster.store import Principal, Role

__all__ = ["UPLOAD_PATH", "router"]

router = APIRouter(prefix="/v1/tenants/{tenant}/code", tags=["code"])

#: The upload route's path, a regular expression to match whole (the body limit skips it).
UPLOAD_PATH = r"/v1/tenants/[^/]+/code"

CodeHash = Annotated[str, Path(max_length=64, pattern=CODE_HASH)]

_BINARY = {"schema": {"type": "string", "format": "binary"}}
_ARCHIVE_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/gzip": _BINARY, "application/octet-stream": _BINARY},
    }
}


def _code(request: Request) -> CodeStore:
    store: CodeStore = request.app.state.code
    return store


def _may_upload(request: Request, principal: Principal, tenant: str) -> None:
    require_role(principal, tenant, Role.MEMBER)
    request.app.state.plane.store.get_tenant(tenant)  # a cluster admin may name any: NotFound


@router.post("", status_code=201, openapi_extra=_ARCHIVE_BODY)
async def upload_code(
    request: Request, principal: CurrentPrincipal, tenant: TenantName
) -> CodeStoredOut:
    """Store a code archive (a ``tar.gz``, the body, streamed) for the tenant (member role).
    Stored once per tenant and hash: the same archive again answers ``stored: false``. 413 over
    the upload cap or the tenant's total, 400 for an archive that would not unpack; then
    nothing is stored."""
    await run_in_threadpool(_may_upload, request, principal, tenant)
    settings = request.app.state.plane.settings
    cap = settings.max_code_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > cap):
        detail = f"the code archive is larger than the upload cap of {cap} bytes"
        raise HTTPException(413, detail=detail)
    try:
        stored = await _code(request).put_async(
            tenant,
            request.stream(),
            max_bytes=cap,
            tenant_quota_bytes=settings.max_code_bytes_per_tenant,
        )
    except CodeTooLarge as error:  # the cap or the tenant's total
        raise HTTPException(413, detail=str(error)) from None
    except CodeTreeError as error:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, detail=str(error)) from None
    outcome = None if stored.new else "unchanged"
    audit_target(request, tenant=tenant, object=stored.sha256, outcome=outcome)
    return CodeStoredOut(sha256=stored.sha256, size=stored.size, stored=stored.new)


@router.get("/{sha256}")
def code_info(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, sha256: CodeHash
) -> CodeOut:
    """The tenant's archive of that hash (viewer role); 404 when the tenant has none."""
    return CodeOut(sha256=sha256, size=_size(request, principal, tenant, sha256))


@router.head("/{sha256}")
def code_exists(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, sha256: CodeHash
) -> Response:
    """200 when the tenant has stored that archive, 404 when not (an upload to skip or make)."""
    size = _size(request, principal, tenant, sha256)
    return Response(status_code=200, headers={"X-Code-Size": str(size)})


def _size(request: Request, principal: Principal, tenant: str, sha256: str) -> int:
    require_role(principal, tenant, Role.VIEWER)
    try:
        return _code(request).size(tenant, sha256)
    except CodeNotFound:
        raise HTTPException(404, detail=f"tenant {tenant!r} has no code {sha256}") from None
