"""The scheduler's fast paths decide exactly what the plain searches they replace decided."""

from __future__ import annotations

import random

import pytest

from aicluster.core import Cluster, Job, Node, PendingCode, Slot, make_cluster
from aicluster.scheduler import (
    FreeIndex,
    PlacementFailure,
    SchedulerConfig,
    SchedulerState,
    find_placement,
    schedule,
)
from aicluster.scheduler import cycle as cycle_module
from aicluster.scheduler.backfill import _candidate_groups


def _reference_node_group(index: FreeIndex, job: Job, types: list[str]) -> list[int] | None:
    """The original NODE level of the reservation search: sort every fitting node."""
    unit = job.unit_gpus
    groups = [[i] for i, n in enumerate(index.nodes) if n.gpu_type in types]
    fitting = [
        g
        for g in groups
        if sum(index.nodes[i].gpus // unit for i in g if index.schedulable[i]) >= job.units
    ]
    if not fitting:
        return None
    free_units = lambda g: sum(index.free[i] // unit for i in g if index.schedulable[i])  # noqa: E731
    return sorted(fitting, key=lambda g: -free_units(g))[0]


def _mixed_cluster(rng: random.Random) -> Cluster:
    nodes = [
        Node(f"n{i}", rng.choice([4, 8, 8]), rng.choice(["A", "B"]), f"r{i // 3}", "p0")
        for i in range(12)
    ]
    return Cluster("mixed", tuple(nodes))


@pytest.mark.parametrize("seed", range(40))
def test_the_reserved_node_is_the_one_sorting_every_node_would_pick(seed: int) -> None:
    rng = random.Random(seed)
    index = FreeIndex(_mixed_cluster(rng))
    for node in index.nodes:
        used = rng.randint(0, node.gpus)
        if used:
            index.allocate([Slot(node.name, used)])
        if rng.random() < 0.2:
            index.set_schedulable(node.name, False)
    for gpus in (1, 2, 3, 4, 6, 8):
        job = Job(id="j", tenant="t", workers=1, gpus_per_worker=gpus)
        types = rng.choice([["A"], ["B"], ["A", "B"]])
        groups = _candidate_groups(index, job, types)
        expected = _reference_node_group(index, job, types)
        if expected is not None:
            assert groups[0] == expected


def test_free_gpus_on_excluded_nodes_do_not_count() -> None:
    index = FreeIndex(make_cluster(nodes=2))
    index.allocate([Slot("node-0", 4)])
    eight = Job(id="eight", tenant="t", gpus_per_worker=8)
    failure = find_placement(index, eight, exclude=frozenset({1}))
    assert isinstance(failure, PlacementFailure)
    assert (failure.code, failure.message) == (PendingCode.NO_CAPACITY, "needs 8 GPUs, 4 free")
    four = Job(id="four", tenant="t", gpus_per_worker=4)
    placed = find_placement(index, four, exclude=frozenset({1}))
    assert not isinstance(placed, PlacementFailure)
    assert placed.nodes == ("node-0",)


def test_the_index_version_moves_with_every_change() -> None:
    index = FreeIndex(make_cluster(nodes=1))
    seen = [index.version]
    index.allocate([Slot("node-0", 2)])
    seen.append(index.version)
    index.release([Slot("node-0", 2)])
    seen.append(index.version)
    index.set_schedulable("node-0", False)
    seen.append(index.version)
    assert seen == sorted(set(seen))


def test_lanes_of_one_shape_share_a_failed_search_while_nothing_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = SchedulerState(make_cluster(nodes=1), config=SchedulerConfig(explain=False))
    state.submit(Job(id="big", tenant="x", gpus_per_worker=6), 0.0)
    plan = schedule(state.snapshot(0.0))
    state.start("big", plan.admissions[0].placement, 0.0)
    for tenant in "abc":  # one lane per tenant, all of the same shape
        state.submit(Job(id=tenant, tenant=tenant, gpus_per_worker=4, submit_time=1.0), 1.0)
    searches: list[str] = []
    real = cycle_module.find_placement

    def counted(index: FreeIndex, job: Job, **options: object) -> object:
        searches.append(job.id)
        return real(index, job, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle_module, "find_placement", counted)
    plan = schedule(state.snapshot(1.0))
    assert plan.admissions == []
    # a fails and reserves the node; b searches once against the reservation; c reuses that.
    assert searches == ["a", "b"]
    assert plan.pending["b"] == plan.pending["c"]
    assert state.tenant("a") is state.tenant("a")
