"""The audit log: the store's event log, filtered and paged.

It holds one ``api.*`` record per API call that changed state (:mod:`aicluster.api.auditlog`),
the changes those calls made (``job.submitted``, ``tenant.updated``, ``token.created``, ...)
and every decision of the control loop that moved a job (``job.transition``). A cluster admin
reads every event and may keep one tenant's; anyone else reads only the events of the tenants it
has a role in: events of no tenant (users, tokens, nodes, leadership) are cluster admins' only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel

from aicluster.api.auth import CurrentPrincipal, readable_tenants
from aicluster.api.params import TEXT_PATTERN, USER_PATTERN, TenantFilter, UnixTime
from aicluster.api.schemas import EventOut
from aicluster.store.jobs import MAX_AUDIT_PAGE, AuditQuery

__all__ = ["AuditPageOut", "router"]

router = APIRouter(prefix="/v1", tags=["audit"])


class AuditPageOut(BaseModel):
    items: list[EventOut]
    #: Pass as ``cursor`` for the next page; None on the last.
    next_cursor: int | None


@router.get("/audit")
def audit(
    request: Request,
    principal: CurrentPrincipal,
    since: UnixTime = None,
    until: UnixTime = None,
    actor: Annotated[
        str | None, Query(max_length=128, pattern=USER_PATTERN, description="who acted")
    ] = None,
    action: Annotated[
        str | None,
        Query(
            max_length=64,
            pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
            description="an event kind (job.transition), or a prefix of kinds ending in '.' (job.)",
        ),
    ] = None,
    object: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=253,
            pattern=TEXT_PATTERN,
            description="a job id, or a node, user, token id, model, deployment or tenant name",
        ),
    ] = None,
    tenant: TenantFilter = None,
    order: Annotated[Literal["newest", "oldest"], Query(description="which end first")] = "newest",
    cursor: Annotated[int | None, Query(ge=0, le=(1 << 63) - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 100,
) -> AuditPageOut:
    """Events newest first (``order=oldest``: oldest first), in pages of ``limit``: what was
    done, by whom (``actor``), to what (``object``), when, in which tenant. Cluster admins see
    every event; others only their tenants' (``tenant`` keeps one of them)."""
    tenants = readable_tenants(principal, tenant, since, until)
    query = AuditQuery(
        since=since,
        until=until,
        actor=actor,
        action=action,
        object=object,
        cursor=cursor,
        newest_first=order == "newest",
        limit=limit,
    )
    events, next_cursor = request.app.state.plane.store.audit_page(tenants, query)
    return AuditPageOut(items=[EventOut.of(e) for e in events], next_cursor=next_cursor)
