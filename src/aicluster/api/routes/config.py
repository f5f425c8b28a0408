"""The scheduler configuration: read by every user, applied by cluster admins."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import CurrentPrincipal, require_cluster_admin
from aicluster.api.schemas import TenantOut
from aicluster.configuration import Configuration, parse_configuration
from aicluster.store import ConfigRecord, Principal

__all__ = ["ConfigOut", "router"]

router = APIRouter(prefix="/v1", tags=["configuration"])

#: The file name recorded with an applied configuration (for people reading the history).
SourceName = Annotated[str, Query(max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$")]


class ConfigOut(BaseModel):
    id: int  # 0: nothing applied, the documented defaults are live
    policy: str
    source: str | None
    applied_by: str | None
    applied_at: float | None
    sha256: str | None
    configuration: dict[str, Any]
    tenants: list[TenantOut]  # only the caller's own tenants' quotas (all for cluster admins)


@router.get("/config")
def show_config(request: Request, principal: CurrentPrincipal) -> ConfigOut:
    """The live scheduler configuration, with the policy named."""
    return _described(request, principal, request.app.state.plane.store.current_config())


@router.put("/config")
async def apply_config(
    request: Request, principal: CurrentPrincipal, source: SourceName = "api"
) -> ConfigOut:
    """Validate a configuration file (the body, YAML) and make it live at the next cycle.
    Cluster admins only. A bad file answers 400 naming the key and line; nothing changes."""
    require_cluster_admin(principal)
    text = (await request.body()).decode("utf-8", errors="replace")
    try:
        parse_configuration(text, source)
    except ValueError as error:  # ConfigError: the file's name, the line and the key
        raise HTTPException(400, str(error)) from None
    plane = request.app.state.plane
    record = plane.store.apply_config(text, source, principal.user)
    audit_target(request, object=f"config {record.id}")
    plane.wake()
    return _described(request, principal, record)


def _described(request: Request, principal: Principal, record: ConfigRecord | None) -> ConfigOut:
    configuration = (
        Configuration() if record is None else parse_configuration(record.text, record.source)[0]
    )
    plane = request.app.state.plane
    usage = plane.usage_by_tenant()
    return ConfigOut(
        id=0 if record is None else record.id,
        policy=configuration.policy.name,
        source=None if record is None else record.source,
        applied_by=None if record is None else record.applied_by,
        applied_at=None if record is None else record.applied_at,
        sha256=None if record is None else record.sha256,
        configuration=configuration.described(),
        tenants=[
            TenantOut.of(tenant, usage.get(tenant.name, {}))
            for tenant in plane.store.list_tenants()
            if principal.role_in(tenant.name) is not None
        ],
    )
