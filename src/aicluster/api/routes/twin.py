"""The live cluster as a twin: its history as a trace, its nodes, its configuration (cluster
admins only: the trace holds every tenant's jobs)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel

from aicluster.api.auth import CurrentPrincipal, require_cluster_admin
from aicluster.control.views.twin import export_twin

__all__ = ["TwinExportOut", "router"]

router = APIRouter(prefix="/v1", tags=["twin"])

Time = Annotated[
    float | None, Query(ge=0, le=1e11, allow_inf_nan=False, description="Unix seconds (UTC)")
]


class TwinExportOut(BaseModel):
    trace_csv: str  # the generic CSV `aicluster sim --trace` loads
    cluster_yaml: str  # the cluster file `aicluster sim --cluster` loads
    config_yaml: str  # the configuration in force, with the tenants (`aicluster sim --config`)
    jobs: int
    origin: float  # Unix seconds of the trace's t=0
    #: Per tenant: the exported jobs' cost of preemption (aicluster.core.preemption_cost).
    preemption_cost: dict[str, dict[str, Any]] = {}


@router.get("/twin/export")
def twin_export(
    request: Request, principal: CurrentPrincipal, since: Time = None, until: Time = None
) -> TwinExportOut:
    """The jobs submitted in ``[since, until)`` that ran and ended, as a replayable trace, beside
    the nodes and the configuration in force (see docs/twin.md)."""
    require_cluster_admin(principal)
    if since is not None and until is not None and since >= until:
        raise HTTPException(422, detail="since must be before until")
    return TwinExportOut(**asdict(export_twin(request.app.state.plane.store, since, until)))
