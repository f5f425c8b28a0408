"""A held cycle (``schedule(hold=True)``, the simulator's shortcut) leaves the index exactly as
rolling back and allocating the admissions again does: the same counts, bucket order, capacity
buckets, content hash and watts; and it holds nothing when the cycle preempts."""

from __future__ import annotations

import random
from typing import Any

from aicluster.core import Job, NodeShape, Plan, Slot, make_cluster
from aicluster.scheduler import FreeIndex, SchedulerConfig, SchedulerState, make_state, schedule


def _index_view(index: FreeIndex) -> tuple[object, ...]:
    """Everything a later decision may read, bucket order included."""
    buckets = {t: [list(bucket) for bucket in by_free] for t, by_free in index.buckets.items()}
    fits = {key: [sorted(b) for b in fit.buckets] for key, fit in index._by_capacity.items()}
    racks = [list(rack.histogram) for rack in index.racks]
    return (index.digest(), index.watts, index.content_hash, buckets, fits, racks)


def _state(policy: str, **config: Any) -> SchedulerState:
    cluster = make_cluster(
        nodes=24, gpus_per_node=8, nodes_per_rack=4, shape=NodeShape(cpus=64, memory_gb=512)
    )
    return make_state(cluster, {}, SchedulerConfig(queue=policy, explain=False, **config))


def _job(rng: random.Random, n: int, priority: int = 50) -> Job:
    gpus = rng.choice([1, 2, 4, 8, 8, 16, 32])
    workers = max(1, gpus // 8)
    return Job(
        id=f"j{n}",
        tenant=rng.choice(["a", "b"]),
        workers=workers,
        gpus_per_worker=gpus // workers,
        cpus_per_worker=rng.choice([0.0, 2.0]),
        memory_gb_per_worker=rng.choice([0.0, 16.0]),
        duration_estimate=rng.uniform(60, 3600),
        priority=priority,
    )


def _apply(state: SchedulerState, plan: Plan, now: float, *, held: bool) -> None:
    for preempt in plan.preemptions:
        state.stop(preempt.job_id, now, requeue=True)
    for admit in plan.admissions:
        state.start(admit.job_id, admit.placement, now, allocated=held)


def _drive(policy: str, seed: int, ends: float = 0.2, **config: Any) -> tuple[int, int]:
    """The same random workload on a plain state and a held one (``ends``: the chance a running
    job ends at a cycle); returns (cycles held, cycles) after checking both alike at every
    cycle."""
    rng = random.Random(seed)
    plain, held = _state(policy, **config), _state(policy, **config)
    cycles = holds = 0
    for step in range(60):
        now = step * 60.0
        for n in range(rng.randint(0, 4)):
            job = _job(rng, step * 10 + n, priority=rng.choice([50, 50, 90]))
            plain.submit(job, now)
            held.submit(job, now)
        for job_id in sorted(plain.running):
            if rng.random() < ends:
                plain.stop(job_id, now, requeue=False)
                held.stop(job_id, now, requeue=False)
        for state in (plain, held):
            state.refresh(now)
        plan = schedule(plain.snapshot(now))
        kept = schedule(held.snapshot(now), hold=True)
        assert not plan.held
        assert [(a.job_id, a.placement) for a in kept.admissions] == [
            (a.job_id, a.placement) for a in plan.admissions
        ]
        assert [p.job_id for p in kept.preemptions] == [p.job_id for p in plan.preemptions]
        if kept.preemptions:
            assert not kept.held
        _apply(plain, plan, now, held=False)
        _apply(held, kept, now, held=kept.held)
        assert _index_view(held.index) == _index_view(plain.index)
        cycles += 1
        holds += kept.held
    return holds, cycles


def test_a_held_cycle_leaves_the_index_as_a_rolled_back_one_and_allocating_again() -> None:
    for seed in range(4):
        holds, _ = _drive("fifo", seed)
        assert holds > 0  # (not every cycle: one whose searches changed more does not hold)


def test_a_cycle_that_preempts_holds_nothing_and_still_decides_alike() -> None:
    holds, cycles = _drive("priority", 7, ends=0.02, priority_gap=10)
    assert 0 < holds < cycles  # some cycles preempted (not held), the others held


def test_without_shortcuts_nothing_is_held() -> None:
    holds, _ = _drive("fifo", 1, shortcuts=False)
    assert holds == 0


def test_only_exactly_the_admissions_allocations_in_order_may_be_held() -> None:
    index = _state("fifo").index
    name = [node.name for node in index.nodes]
    first = (Slot(name[0], 8, 0, 2.0, 16.0),)
    second = (Slot(name[1], 4, 0), Slot(name[2], 4, 0))
    with index.tentative() as tentative:
        tentative.allocate(first)
        tentative.allocate(second)
        assert index.holds_exactly([first, second])
        assert not index.holds_exactly([second, first])  # another order
        assert not index.holds_exactly([first])  # more was changed than admitted
        assert not index.holds_exactly([first, second, (Slot(name[3], 8, 0),)])
        tentative.release(second)
        tentative.allocate(second)  # a search's trial: net nothing, but the buckets moved
        assert not index.holds_exactly([first, second])
    assert not index.holds_exactly([first, second])  # outside a tentative section
