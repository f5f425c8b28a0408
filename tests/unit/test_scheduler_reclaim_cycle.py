"""A defect now mended, kept as a deterministic case: with quotas and borrowing, reclaim and
cross-tenant priority preemption chased each other for ever.

Found by ``tests/property/test_scheduler_properties.py::test_reclaims_settle_when_nothing_changes``
(by chance: Hypothesis draws it rarely; present since at least 370f176). Nothing finishing, the
cycles repeated: c reclaims its quota from a's j2 to start j4; c's j3 preempts j4 by priority,
c borrowing 4; a's j2 (borrowing, priority 300) preempts j3 by priority; c reclaims again. The
rights by standing (``aicluster.scheduler.rights``: a borrower takes borrowed jobs only) settle
it; ``tests/unit/test_preemption_cycles.py`` finds the cycle again under the legacy rights.
"""

from __future__ import annotations

from aicluster.core import DomainLevel, Job, Tenant, make_cluster
from aicluster.scheduler import SchedulerConfig, make_state, schedule

_NODE = DomainLevel.NVLINK
# (id, tenant, workers, GPUs per worker, priority, largest domain, preemptible), in arrival order.
_JOBS = [
    ("j0", "a", 1, 1, 100, _NODE, False),
    ("j1", "a", 4, 2, 100, DomainLevel.POD, False),
    ("j2", "a", 2, 1, 300, _NODE, True),
    ("j3", "c", 3, 2, 200, DomainLevel.POD, True),
    ("j4", "c", 2, 1, 100, _NODE, True),
    ("j5", "b", 1, 2, 100, _NODE, False),
    ("j6", "a", 1, 1, 100, _NODE, False),
    ("j7", "b", 2, 1, 100, _NODE, False),
    *((f"j{i}", "a", 1, 1, 100, _NODE, False) for i in range(8, 14)),
]


def test_reclaim_and_priority_preemption_settle() -> None:
    tenants = {
        "a": Tenant("a", quota={"H100": 0}, borrow_limit={"H100": 10}),
        "b": Tenant("b", quota={"H100": 4}, borrow_limit={"H100": 0}),
        "c": Tenant("c", quota={"H100": 2}, borrow_limit={"H100": 6}),
    }
    cluster = make_cluster(nodes=3, gpus_per_node=4, nodes_per_rack=1, racks_per_pod=2)
    config = SchedulerConfig(queue="fifo", backfill="easy", preemption=True)
    state = make_state(cluster, tenants, config)
    for at, (job_id, tenant, workers, gpus, priority, domain, preemptible) in enumerate(_JOBS):
        job = Job(
            id=job_id,
            tenant=tenant,
            workers=workers,
            gpus_per_worker=gpus,
            priority=priority,
            max_domain=domain,
            preemptible=preemptible,
            submit_time=float(at),
        )
        state.submit(job, 0.0)
    preempted = []
    for _ in range(3 * len(_JOBS)):
        state.refresh(0.0)
        plan = schedule(state.snapshot(0.0))
        preempted.append(len(plan.preemptions))
        for preempt in plan.preemptions:
            state.stop(preempt.job_id, 0.0, requeue=True)
        for admit in plan.admissions:
            state.start(admit.job_id, admit.placement, 0.0)
    assert preempted[-6:] == [0] * 6, preempted
