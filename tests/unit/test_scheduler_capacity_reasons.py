""" "Cannot fit" reasons name the shape a job asked for (workers × GPUs, whole nodes or not)
and give the cluster's capacity and its current use apart: live (what is free now) and at
submit (what the cluster has, and what jobs hold)."""

from __future__ import annotations

from aicluster.api.feasible import Feasibility
from aicluster.core import Job, PendingCode, Slot, make_cluster
from aicluster.scheduler import FreeIndex, find_placement
from aicluster.scheduler.placement import PlacementFailure

CLUSTER = make_cluster(nodes=2, gpus_per_node=8)  # 16 GPUs


def _why(job: Job, held: int = 5) -> str:
    index = FreeIndex(CLUSTER)
    index.allocate([Slot("node-0", held)])
    failure = find_placement(index, job)
    assert isinstance(failure, PlacementFailure) and failure.code is PendingCode.NO_CAPACITY
    return failure.message


def test_a_gang_of_whole_nodes_names_its_shape_the_capacity_and_what_is_free() -> None:
    job = Job(id="big", tenant="t", workers=3, gpus_per_worker=8)
    assert _why(job) == (
        "needs 3 workers × 8 GPUs (whole nodes) = 24 GPUs; the cluster has 16 GPUs, 11 free"
    )


def test_a_gang_of_partial_nodes_and_a_single_worker() -> None:
    six = Job(id="six", tenant="t", workers=6, gpus_per_worker=2)
    assert _why(six) == "needs 6 workers × 2 GPUs = 12 GPUs; the cluster has 16 GPUs, 11 free"
    single = Job(id="one", tenant="t", workers=12, gpus_per_worker=1)
    assert _why(single).startswith("needs 12 workers × 1 GPU = 12 GPUs;")
    typed = Job(id="typed", tenant="t", workers=2, gpus_per_worker=8, gpu_type="H100")
    assert _why(typed) == (
        "needs 2 workers × 8 GPUs (whole nodes) = 16 GPUs; the cluster has 16 H100 GPUs, 11 free"
    )


def test_at_submit_the_refusal_gives_capacity_and_use_apart() -> None:
    feasibility = Feasibility(lambda: CLUSTER.nodes, lambda: {"node-0": 5, "elsewhere": 3})
    job = Job(id="big", tenant="t", workers=3, gpus_per_worker=8)
    assert feasibility.refusal(job) == (
        "needs 3 workers × 8 GPUs (whole nodes) = 24 GPUs; the cluster has 16 GPUs (5 in use)"
    )
    assert feasibility.refusal(Job(id="fits", tenant="t", workers=2, gpus_per_worker=8)) is None
    too_wide = Job(id="wide", tenant="t", workers=1, gpus_per_worker=16)
    assert feasibility.refusal(too_wide) == (
        "a worker needs 16 GPUs on one node; the largest node has 8"
    )
