"""The cluster map: pods → racks → nodes → GPUs, each GPU with the job that holds it, scoped to
what the caller may see (another tenant's job is an anonymous busy GPU)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from aicluster.control.views.powerview import NodePower, rack_power
from aicluster.store import NodeRecord, PlacedJob, Principal

__all__ = ["ClusterMapOut", "MapJob", "MapNode", "cluster_map"]

#: The job index of a GPU held by a job the caller may not see.
HIDDEN = -1


class MapJob(BaseModel):
    id: str
    name: str
    tenant: str
    state: str
    gpus: int


class MapNode(BaseModel):
    name: str
    gpu_type: str
    gpus: int
    health: str
    reason: str | None
    power: str = Field(description="power saving's state: on, suspending, off, resuming, ...")
    watts: float | None = Field(description="its draw (None where the scheduler has no state)")
    watts_source: str | None = Field(description="measured (NVML, RAPL) or modelled")
    slots: list[tuple[int, int]] = Field(
        description="[job index into jobs, or -1 for another tenant's job; GPUs], in GPU order"
    )


class MapRack(BaseModel):
    name: str
    nodes: list[MapNode]
    watts: float | None = Field(description="its nodes' draw")
    watts_source: str | None = Field(description="measured, modelled or partial")


class MapPod(BaseModel):
    name: str
    racks: list[MapRack]


class ClusterMapOut(BaseModel):
    tenants: list[str] = Field(description="tenants the caller sees, in colour order")
    jobs: list[MapJob] = Field(description="visible jobs holding GPUs")
    pods: list[MapPod]
    gpus: int
    busy: int
    running_jobs: int = Field(description="jobs holding GPUs, cluster-wide")
    pending_jobs: int = Field(description="jobs waiting, cluster-wide")


def cluster_map(
    nodes: Iterable[NodeRecord],
    placed: Iterable[PlacedJob],
    principal: Principal,
    counts: Mapping[str, int] | None = None,
    power: Sequence[NodePower] = (),
) -> dict[str, Any]:
    """The map as JSON data in the shape of :class:`ClusterMapOut`. Plain dicts, not models:
    a thousand nodes would cost more to build and validate as models than to read."""
    jobs: list[dict[str, Any]] = []
    held: dict[str, list[tuple[int, int, int]]] = {}  # node -> (nvlink domain, job index, gpus)
    for job in placed:
        visible = principal.role_in(job.tenant) is not None
        index = len(jobs) if visible else HIDDEN
        if visible:
            jobs.append(
                {"id": job.id, "name": job.name, "tenant": job.tenant, "state": job.state.value}
                | {"gpus": job.gpus}
            )
        for name, gpus, domain in _slots(job.placement):
            held.setdefault(name, []).append((domain, index, gpus))
    pods: dict[str, dict[str, list[dict[str, Any]]]] = {}
    drawn = {each.node: each for each in power}
    racks = rack_power(list(power))
    total = busy = 0
    for record in nodes:
        node = record.node
        slots = [[index, gpus] for _, index, gpus in sorted(held.get(node.name, []))]
        total += node.gpus
        busy += sum(gpus for _, gpus in slots)
        pods.setdefault(node.pod, {}).setdefault(node.rack, []).append(
            {
                "name": node.name,
                "gpu_type": node.gpu_type,
                "gpus": node.gpus,
                "health": record.health.value,
                "reason": record.health_reason,
                "power": record.power,
                "watts": round(drawn[node.name].watts, 1) if node.name in drawn else None,
                "watts_source": drawn[node.name].source if node.name in drawn else None,
                "slots": slots,
            }
        )
    return {
        "tenants": sorted({job["tenant"] for job in jobs} | set(principal.roles)),
        "jobs": jobs,
        "pods": [
            {"name": pod, "racks": [_rack(rack, ns, racks) for rack, ns in sorted(r.items())]}
            for pod, r in sorted(pods.items())
        ],
        "gpus": total,
        "busy": busy,
        "running_jobs": (counts or {}).get("running", 0),
        "pending_jobs": (counts or {}).get("pending", 0),
    }


def _rack(
    name: str, nodes: list[dict[str, Any]], racks: Mapping[str, tuple[float, str]]
) -> dict[str, Any]:
    watts, source = racks.get(name, (None, None))
    return {
        "name": name,
        "nodes": nodes,
        "watts": None if watts is None else round(watts, 1),
        "watts_source": source,
    }


def _slots(placement: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """(node, gpus, nvlink domain) of each slot (a slot also holds its CPUs and memory, after
    these; placements stored before CPUs and memory were placed hold only these three); a
    malformed placement shows nothing."""
    found = []
    for slot in placement.get("slots", []):
        try:
            node, gpus, domain = slot[:3]
            found.append((str(node), int(gpus), int(domain)))
        except (TypeError, ValueError):
            continue
    return found
