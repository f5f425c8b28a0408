"""Cluster capacity and usage, nodes (cordon/uncordon), and the queue."""

from __future__ import annotations

from fastapi import APIRouter, Request

from aicluster.api.auth import CurrentPrincipal, require_cluster_admin, require_role
from aicluster.api.params import NodeName, Reason, TenantFilter
from aicluster.api.schemas import ClusterOut, NodeOut, PreemptionCostOut, QueueEntryOut
from aicluster.store import NodeHealth, Role

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["cluster"])


@router.get("/cluster")
def cluster(request: Request, principal: CurrentPrincipal) -> ClusterOut:
    """Capacity and use per GPU type; per-tenant use and cost of preemption only for tenants
    the caller can see."""
    plane = request.app.state.plane
    nodes = plane.store.list_nodes()
    capacity: dict[str, int] = {}
    for record in nodes:
        capacity[record.node.gpu_type] = capacity.get(record.node.gpu_type, 0) + record.node.gpus
    by_tenant = plane.usage_by_tenant()
    used: dict[str, int] = {}
    for amounts in by_tenant.values():
        for gpu_type, gpus in amounts.items():
            used[gpu_type] = used.get(gpu_type, 0) + gpus
    visible = {t: u for t, u in by_tenant.items() if principal.role_in(t) is not None}
    counts = plane.job_counts()
    costs = {
        tenant: PreemptionCostOut(**cost.figures())
        for tenant, cost in sorted(plane.preemption_cost().items())
        if principal.role_in(tenant) is not None
    }
    return ClusterOut(
        nodes=len(nodes),
        healthy_nodes=sum(1 for record in nodes if record.schedulable),
        capacity=capacity,
        used=used,
        used_by_tenant=visible,
        pending_jobs=counts.get("PENDING", 0),
        running_jobs=counts.get("RUNNING", 0) + counts.get("STARTING", 0),
        preemption_cost=costs,
    )


@router.get("/nodes")
def nodes(request: Request, principal: CurrentPrincipal) -> list[NodeOut]:
    plane = request.app.state.plane
    used = plane.gpus_used_by_node()
    return [NodeOut.of(r, used.get(r.node.name, 0)) for r in plane.store.list_nodes()]


def _set_health(
    request: Request, principal: CurrentPrincipal, name: str, health: NodeHealth, reason: str | None
) -> NodeOut:
    require_cluster_admin(principal)
    plane = request.app.state.plane
    record = plane.store.set_node_health(name, health, principal.user, reason)
    plane.wake()
    return NodeOut.of(record, plane.gpus_used_by_node().get(name, 0))


@router.post("/nodes/{name}/cordon")
def cordon(
    request: Request,
    principal: CurrentPrincipal,
    name: NodeName,
    reason: Reason = None,
) -> NodeOut:
    """Place nothing new on the node (running jobs stay). Cluster admins only."""
    return _set_health(request, principal, name, NodeHealth.CORDONED, reason or "cordoned")


@router.post("/nodes/{name}/drain")
def drain(
    request: Request,
    principal: CurrentPrincipal,
    name: NodeName,
    reason: Reason = None,
) -> NodeOut:
    """Cordon the node and move its jobs elsewhere (each checkpoints, then is requeued)."""
    return _set_health(request, principal, name, NodeHealth.DRAINING, reason or "draining")


@router.post("/nodes/{name}/uncordon")
def uncordon(request: Request, principal: CurrentPrincipal, name: NodeName) -> NodeOut:
    return _set_health(request, principal, name, NodeHealth.HEALTHY, None)


@router.get("/queue")
def queue(
    request: Request,
    principal: CurrentPrincipal,
    tenant: TenantFilter = None,
) -> list[QueueEntryOut]:
    """Pending jobs in scheduling order, each with its position and reason. Positions are
    cluster-wide; jobs of tenants the caller cannot see are left out."""
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
    entries = request.app.state.plane.queue()
    return [
        entry
        for entry in entries
        if principal.role_in(entry.tenant) is not None and tenant in (None, entry.tenant)
    ]
