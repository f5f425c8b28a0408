"""Pipelines kept inside racks: a placement preference for gangs with pipeline stages.

The runtime numbers a gang's ranks rack by rack (racks and nodes in placement order), and
``train.mesh()`` lays them out as ``dp × pp × tp``: one pipeline (its stages, each stage's
tensor-parallel group) is ``pipeline × tensor`` consecutive ranks, and data parallelism runs
across pipelines. A pipeline stays inside one rack when every rack holds whole pipelines of the
gang. A gang too wide for one rack is packed rack by rack in whole pipelines where the racks
allow it; where they do not, the plain pack stands: a preference, not a rule. The placement's
score says how many pipelines ended up inside one rack
(:func:`.result.pipelines_in_rack`).
"""

from __future__ import annotations

from collections.abc import Sequence

from aicluster.core import Job, Placement
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement.result import fewest_nodes, pipelines_in_rack

__all__ = ["by_rack_in_pipelines", "describe_mesh", "units_per_pipeline"]


def units_per_pipeline(job: Job) -> int | None:
    """Placement units of one pipeline; None when the job has no pipeline stages, or when one
    unit (on one node) holds whole pipelines, which then never leave a rack."""
    p = job.parallelism
    gpus = p.pipeline * p.tensor
    if p.pipeline <= 1 or not job.unit_gpus or gpus % job.unit_gpus:
        return None
    return gpus // job.unit_gpus


def by_rack_in_pipelines(
    index: FreeIndex, job: Job, capacities: Sequence[tuple[int, int]], per_pipeline: int
) -> list[tuple[int, int]] | None:
    """Units per node for the gang, each rack taking whole pipelines (the racks holding the most
    first), from ``capacities`` (units each node can take, by node); None when they cannot."""
    racks: dict[str, list[tuple[int, int]]] = {}
    for capacity, node in capacities:
        racks.setdefault(index.nodes[node].rack, []).append((capacity, node))
    holding = sorted(
        ((sum(c for c, _ in nodes) // per_pipeline, rack) for rack, nodes in racks.items()),
        key=lambda item: (-item[0], item[1]),
    )
    pipelines = job.units // per_pipeline
    chosen: list[tuple[int, int]] = []
    for whole, rack in holding:
        take = min(whole, pipelines)
        if take <= 0:
            break
        chosen += fewest_nodes(racks[rack], take * per_pipeline) or []
        pipelines -= take
    return chosen if pipelines == 0 else None


def describe_mesh(index: FreeIndex, job: Job, placement: Placement) -> str:
    """The device mesh a placement gives a job with tensor or pipeline parallelism (``why``)."""
    p = job.parallelism
    data = job.total_gpus // (p.pipeline * p.tensor) if job.total_gpus else p.data
    said = f"mesh dp={data} x pp={p.pipeline} x tp={p.tensor}"
    if p.tensor > 1:
        said += ", each tensor-parallel group in one NVLink domain"
    if p.pipeline > 1:
        inside, pipelines = pipelines_in_rack(index, job, placement.slots)
        said += f", {inside} of {pipelines} pipelines inside one rack"
    return said
