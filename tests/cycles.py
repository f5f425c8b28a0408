"""A preemption cycle checker: drives the real ``schedule()`` over small worlds with nothing
arriving, nothing finishing and the clock stopped, and reports a world whose decisions do not
reach a fixed point (a cycle that neither admits nor preempts).

Every admission that preempts must raise the measure of the termination argument
(:mod:`aicluster.scheduler.preemption`), so the set of running jobs never comes back to one it
left: the checker reports a world as soon as it does (or when ``bound`` cycles pass). A found
world prints as a row for the tables of ``tests/unit/test_preemption_cycles.py``::

    print(row("found", world))

With the clock moving instead (:func:`early_preemptions`), it reports every preemption that a
protection against thrashing (:mod:`aicluster.scheduler.protection`) should have held back.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from aicluster.core import DomainLevel, Job, Tenant, VictimKind, make_cluster
from aicluster.scheduler import SchedulerConfig, SchedulerState, make_state, schedule
from aicluster.scheduler.entries import Progress
from aicluster.scheduler.rights import PreemptionRights

__all__ = ["POLICIES", "Spec", "World", "cycle_of", "early_preemptions", "row", "tiny_worlds"]

#: Every queue policy (the preemptive ones most of all).
POLICIES = ("fifo", "priority", "sjf", "srtf", "tiresias", "fair")
#: Tiresias' queues in the checker: attained service 0 is queue 0, 10 queue 1, 100 queue 2.
THRESHOLDS = (4.0, 40.0)


@dataclass(frozen=True)
class Spec:
    """One job: its tenant, gang (workers × GPUs each), priority, whether it may be preempted,
    the GPU-seconds it attained before (Tiresias' queue) and its length (SRTF's order)."""

    tenant: str
    workers: int
    gpus: int
    priority: int = 100
    preemptible: bool = True
    service: float = 0.0
    length: float = 100.0
    domain: DomainLevel = DomainLevel.CLUSTER  # the largest that may hold the gang


@dataclass(frozen=True)
class World:
    """A cluster of ``nodes`` × ``gpus_per_node`` H100s, tenants as (name, quota, borrow limit)
    (quota None: the tenant has none), jobs submitted in order, and the queue policy."""

    nodes: int
    gpus_per_node: int
    tenants: tuple[tuple[str, int | None, int | None], ...]
    jobs: tuple[Spec, ...]
    policy: str = "fifo"
    nodes_per_rack: int = 16
    racks_per_pod: int = 8


def row(name: str, world: World) -> str:
    """``world`` as a table row to paste (fields at their defaults left out)."""
    return f"    {name!r}: {_literal(world)},"


def _literal(value: object) -> str:
    if isinstance(value, DomainLevel):
        return f"DomainLevel.{value.name}"
    if isinstance(value, tuple):
        items = ", ".join(_literal(item) for item in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    if not isinstance(value, (Spec, World)):
        return repr(value)
    fields = [
        f"{f.name}={_literal(getattr(value, f.name))}"
        for f in dataclasses.fields(value)
        if f.default is dataclasses.MISSING or getattr(value, f.name) != f.default
    ]
    return f"{type(value).__name__}({', '.join(fields)})"


def cycle_of(
    world: World, rights: PreemptionRights | None = None, bound: int | None = None
) -> list[tuple[str, ...]] | None:
    """None if the world settles; else the running jobs cycle by cycle, from the first cycle
    to the one whose running set was seen before (or the ``bound``-th)."""
    # Every job starts at 0 and the clock stands there: protections would hold every victim
    # back, and they only remove preemptions (the termination argument holds).
    state = _state(world, rights, 0.0, 0.0)
    seen: set[tuple[str, ...]] = set()
    trace: list[tuple[str, ...]] = []
    for _ in range(bound or 4 * len(world.jobs) + 4):
        state.refresh(0.0)
        plan = schedule(state.snapshot(0.0))
        if not plan.preemptions and not plan.admissions:
            return None
        for preempt in plan.preemptions:
            state.stop(preempt.job_id, 0.0, requeue=True)
        for admit in plan.admissions:
            state.start(admit.job_id, admit.placement, 0.0)
        running = tuple(sorted(state.running))
        trace.append(running)
        if running in seen:
            return trace
        seen.add(running)
    return trace


def early_preemptions(
    world: World, min_runtime_s: float, cooldown_s: float, steps: int = 24, protect: bool = True
) -> list[str]:
    """The world's cycles one second apart for ``steps`` seconds, nothing finishing (Tiresias
    demotes and promotes, SRTF's order changes): every preemption of a run younger than
    ``min_runtime_s`` by another tenant's job or the policy's right, or of a run younger than
    ``cooldown_s`` of a job preempted before, as words (none: the protections held).
    ``protect``: False runs the scheduler without them (what the checker finds then)."""
    state = _state(world, None, min_runtime_s, cooldown_s) if protect else _state(world, None, 0, 0)
    found: list[str] = []
    for step in range(steps):
        now = float(step)
        state.refresh(now)
        plan = schedule(state.snapshot(now))
        for preempt in plan.preemptions:
            victim = state.running[preempt.job_id]
            preemptor = state.pending[preempt.for_job or ""].job
            age = now - victim.started_at
            own = preempt.kind is VictimKind.PRIORITY and preemptor.tenant == victim.job.tenant
            again = victim.preempted_at > float("-inf")
            if (age < min_runtime_s and not own) or (again and age < cooldown_s):
                found.append(f"{preempt.job_id} at {age:.0f} s by {preemptor.id} ({preempt.kind})")
            state.stop(preempt.job_id, now, requeue=True, preempted=True)
        for admit in plan.admissions:
            state.start(admit.job_id, admit.placement, now)
    return found


def _state(
    world: World, rights: PreemptionRights | None, min_runtime_s: float, cooldown_s: float
) -> SchedulerState:
    """The world's jobs queued at 0 on its cluster, under the rights and protections given."""
    config = SchedulerConfig(
        queue=world.policy,
        backfill="easy",
        preemption=True,
        tiresias_thresholds=THRESHOLDS,
        rights=rights if rights is not None else PreemptionRights(),
        explain=False,
        min_runtime_s=min_runtime_s,
        cooldown_s=cooldown_s,
    )
    tenants = {
        name: Tenant(name, quota={"H100": quota}, borrow_limit={"H100": limit or 0})
        if quota is not None
        else Tenant(name)
        for name, quota, limit in world.tenants
    }
    cluster = make_cluster(
        nodes=world.nodes,
        gpus_per_node=world.gpus_per_node,
        nodes_per_rack=world.nodes_per_rack,
        racks_per_pod=world.racks_per_pod,
    )
    state = make_state(cluster, tenants, config)
    for at, spec in enumerate(world.jobs):
        job = Job(
            id=f"j{at}",
            tenant=spec.tenant,
            workers=spec.workers,
            gpus_per_worker=spec.gpus,
            priority=spec.priority,
            preemptible=spec.preemptible,
            submit_time=float(at),
            true_duration=spec.length,
            max_domain=spec.domain,
        )
        done = spec.service / job.total_gpus
        state.submit(job, 0.0, progress=Progress(spec.service, done))
    return state


# -- tiny worlds, every one ---------------------------------------------------------------------

#: Tenants: one without a quota each; a borrower beside an owner; two that both borrow.
TENANTS: tuple[tuple[tuple[str, int | None, int | None], ...], ...] = (
    (("a", None, None), ("b", None, None)),
    (("a", 0, 4), ("b", 2, 0)),
    (("a", 1, 2), ("b", 1, 2)),
)
#: Jobs: tenant, gang, priority, attained service (Tiresias' queue 0 or 2; SRTF's order).
MENU = tuple(
    Spec(tenant, workers, gpus, priority, True, service, 100.0 + service)
    for tenant in ("a", "b")
    for workers, gpus in ((1, 1), (1, 2), (2, 1))
    for priority in (100, 200)
    for service in (0.0, 100.0)
)


def tiny_worlds(jobs: int, policies: tuple[str, ...] = POLICIES) -> Iterator[World]:
    """Every world of ``jobs`` jobs from :data:`MENU` (as a multiset, in menu order) on one node
    of 2 GPUs and on two, with each set of :data:`TENANTS`, under each policy."""
    for specs in itertools.combinations_with_replacement(MENU, jobs):
        for nodes, tenants, policy in itertools.product((1, 2), TENANTS, policies):
            yield World(nodes, 2, tenants, specs, policy)
