"""Usage per tenant and per job: GPU-hours, CPU-hours and kWh over a period, from the times the
store recorded each job running (``aicluster.store.usage``) and the power model
(``aicluster.core.usage``). A cluster admin reads every tenant's (``tenant`` keeps one); anyone
else only the tenants it has a role in."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel

from aicluster.api.auth import CurrentPrincipal, readable_tenants
from aicluster.api.params import TenantFilter, UnixTime
from aicluster.core import GpuPower
from aicluster.core.usage import usage as add_up

__all__ = ["UsageOut", "router"]

router = APIRouter(prefix="/v1", tags=["usage"])


class UsageOut(BaseModel):
    since: float | None
    until: float | None
    #: Per tenant: tenant, jobs, gpu_hours, cpu_hours, kwh (the sums of its jobs').
    tenants: list[dict[str, Any]]
    #: Per job: job_id, tenant, name, gpus, cpus, run_seconds, gpu_hours, cpu_hours, kwh.
    jobs: list[dict[str, Any]]


@router.get("/usage")
def usage(
    request: Request,
    principal: CurrentPrincipal,
    since: UnixTime = None,
    until: UnixTime = None,
    tenant: TenantFilter = None,
) -> UsageOut:
    """What each tenant's jobs used in ``[since, until)`` (default: all time up to now)."""
    tenants = readable_tenants(principal, tenant, since, until)
    plane = request.app.state.plane
    runs = plane.store.job_runs(tenants, since, until) if tenants != [] else []
    jobs, totals = add_up(runs, _power_model(plane))
    return UsageOut(
        since=since,
        until=until,
        tenants=[asdict(row) for row in totals],
        jobs=[asdict(row) for row in jobs],
    )


def _power_model(plane: Any) -> Any:
    """The live scheduler's power model (its cluster's watts per GPU type), or the defaults
    on a server that is not the leader."""
    loop = getattr(plane, "loop", None)
    state = loop.shown if loop is not None else None
    return state.cluster.power_of if state is not None else (lambda _type: GpuPower())
