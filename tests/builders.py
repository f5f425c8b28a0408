"""Small builders for tests: ``make_job("a").gpus(8).tenant("t")``, a plan-applying driver, and
a stored service job (a deployment's replica)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aicluster.core import (
    Cluster,
    DomainLevel,
    Job,
    JobState,
    NodeShape,
    Parallelism,
    PendingCode,
    Placement,
    Plan,
    Slot,
    Tenant,
    VictimKind,
    jobspec_from_mapping,
    make_cluster,
)
from aicluster.scheduler import SchedulerConfig, make_state, schedule
from aicluster.store import JobRecord


class JobBuilder:
    def __init__(self, job_id: str) -> None:
        self._job = Job(id=job_id, tenant="default")

    def _with(self, **changes: Any) -> JobBuilder:
        self._job = replace(self._job, **changes)
        return self

    def gpus(self, total: int, per_worker: int | None = None) -> JobBuilder:
        per = per_worker or min(total, 8)
        return self._with(workers=total // per, gpus_per_worker=per)

    def workers(self, count: int, gpus_per_worker: int = 1) -> JobBuilder:
        return self._with(workers=count, gpus_per_worker=gpus_per_worker)

    def host(self, cpus: float = 0.0, memory_gb: float = 0.0) -> JobBuilder:
        """CPUs and memory per worker."""
        return self._with(cpus_per_worker=cpus, memory_gb_per_worker=memory_gb)

    def tenant(self, name: str) -> JobBuilder:
        return self._with(tenant=name)

    def priority(self, value: int) -> JobBuilder:
        return self._with(priority=value)

    def at(self, submit_time: float) -> JobBuilder:
        return self._with(submit_time=submit_time)

    def duration(self, seconds: float) -> JobBuilder:
        return self._with(true_duration=seconds)

    def estimate(self, seconds: float) -> JobBuilder:
        return self._with(duration_estimate=seconds)

    def within(self, level: DomainLevel) -> JobBuilder:
        return self._with(max_domain=level)

    def tensor(self, degree: int) -> JobBuilder:
        return self._with(parallelism=Parallelism(tensor=degree))

    def mesh(self, data: int, pipeline: int = 1, tensor: int = 1) -> JobBuilder:
        return self._with(parallelism=Parallelism(data, tensor, pipeline))

    def gpu_type(self, name: str) -> JobBuilder:
        return self._with(gpu_type=name)

    def not_preemptible(self) -> JobBuilder:
        return self._with(preemptible=False)

    def checkpoint_every(self, seconds: float) -> JobBuilder:
        return self._with(checkpoint_interval=seconds)

    def build(self) -> Job:
        return self._job


def make_job(job_id: str) -> JobBuilder:
    return JobBuilder(job_id)


def small_cluster(nodes: int = 4, gpus: int = 8, per_rack: int = 2, **shape: Any) -> Cluster:
    """``nodes`` nodes of ``gpus`` GPUs, ``per_rack`` a rack; ``shape``: :class:`NodeShape`'s
    fields (``cpus=16, memory_gb=64``, ...)."""
    return make_cluster(
        nodes=nodes, gpus_per_node=gpus, nodes_per_rack=per_rack, shape=NodeShape(**shape)
    )


class Driver:
    """Applies plans the way a control loop does: preemptions first, then admissions."""

    def __init__(
        self,
        cluster: Cluster,
        tenants: dict[str, Tenant] | None = None,
        **config: Any,
    ) -> None:
        config.setdefault("queue", "fifo")  # these tests' own choice, not the default policy
        # and preemption at once: the protections against thrashing (on by default) are the
        # tables' own rows (tests/unit/test_preemption_protection.py)
        config.setdefault("min_runtime_s", 0.0)
        config.setdefault("cooldown_s", 0.0)
        self.state = make_state(cluster, tenants or {}, SchedulerConfig(**config))
        self.now = 0.0

    def submit(self, *builders: JobBuilder | Job) -> None:
        for item in builders:
            job = item.build() if isinstance(item, JobBuilder) else item
            self.state.submit(job, self.now)

    def cycle(self, at: float | None = None) -> Plan:
        if at is not None:
            self.now = at
        self.state.refresh(self.now)
        plan = schedule(self.state.snapshot(self.now))
        for preempt in plan.preemptions:
            self.state.stop(preempt.job_id, self.now, requeue=True, preempted=True)
        for admit in plan.admissions:
            self.state.start(admit.job_id, admit.placement, self.now)
        return plan

    def finish(self, job_id: str, at: float | None = None) -> None:
        if at is not None:
            self.now = at
        self.state.stop(job_id, self.now, requeue=False)

    def occupy(self, job_id: str, node: str, gpus: int, **job: Any) -> None:
        """Start a job by hand on ``node`` (to set up a fragmented cluster)."""
        self.state.submit(
            Job(id=job_id, tenant=job.pop("tenant", "default"), gpus_per_worker=gpus, **job),
            self.now,
        )
        placement = Placement((Slot(node, gpus, 0),), DomainLevel.NODE, node)
        self.state.start(job_id, placement, self.now)

    def node_of(self, job_id: str) -> tuple[str, ...]:
        return self.state.running[job_id].placement.nodes


def admitted(plan: Plan) -> list[str]:
    return [admit.job_id for admit in plan.admissions]


def preempted(plan: Plan) -> list[str]:
    return [p.job_id for p in plan.preemptions]


@dataclass(frozen=True)
class Occupied:
    """A job started by hand on one node (to set up a fragmented cluster)."""

    job_id: str
    node: str
    gpus: int
    estimate: float | None = None


@dataclass(frozen=True)
class Case:
    """One named case of a scheduler table: a cluster, what already runs on it, what is
    submitted, and what the next cycle decides. Rows leave unchecked what they do not name.

    ``running`` is started first, in order: an :class:`Occupied` by hand, a job by a cycle at its
    submit time (which must admit it). ``submit`` is then submitted and one cycle runs ``at``."""

    submit: tuple[JobBuilder, ...]
    cluster: Cluster = field(default_factory=lambda: small_cluster(nodes=1))
    tenants: Mapping[str, Tenant] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    running: tuple[JobBuilder | Occupied, ...] = ()
    checkpoints: Mapping[str, float] = field(default_factory=dict)  # job: last checkpoint
    cordoned: tuple[str, ...] = ()  # nodes that take no new work
    at: float = 0.0
    # What the cycle decides:
    admits: tuple[str, ...] | None = None  # exactly these, in this order
    preempts: tuple[str, ...] | None = None
    victims: int | None = None  # how many, where which is not the point
    borrowed: int | None = None  # admissions that borrow
    kind: VictimKind | None = None  # of every preemption
    backfilled: tuple[str, ...] = ()
    waits: Mapping[str, PendingCode] = field(default_factory=dict)
    says: Mapping[str, str] = field(default_factory=dict)  # job: words in its reason
    on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # job: its nodes after
    used: Mapping[str, int] = field(default_factory=dict)  # tenant: H100 GPUs held after


def decide(case: Case) -> tuple[Driver, Plan]:
    """Set up ``case`` and run its cycle; the driver has applied the plan."""
    driver = Driver(case.cluster, dict(case.tenants), **case.config)
    for item in case.running:
        if isinstance(item, Occupied):
            driver.occupy(item.job_id, item.node, item.gpus, duration_estimate=item.estimate)
            continue
        job = item.build()
        driver.submit(job)
        assert job.id in admitted(driver.cycle(at=job.submit_time)), f"{job.id} did not start"
    for job_id, at in case.checkpoints.items():
        driver.state.checkpointed(job_id, at)
    for node in case.cordoned:
        driver.state.set_node_schedulable(node, False)
    driver.submit(*case.submit)
    return driver, driver.cycle(at=case.at)


def check(case: Case) -> Plan:
    """Run ``case`` and assert every outcome it names."""
    driver, plan = decide(case)
    if case.admits is not None:
        assert admitted(plan) == list(case.admits)
    if case.preempts is not None:
        assert preempted(plan) == list(case.preempts)
    if case.victims is not None:
        assert len(plan.preemptions) == case.victims
    if case.borrowed is not None:
        assert sum(admission.borrowed for admission in plan.admissions) == case.borrowed
    if case.kind is not None:
        assert {p.kind for p in plan.preemptions} == {case.kind}
    assert [a.job_id for a in plan.admissions if a.backfilled] == list(case.backfilled)
    for job_id, code in case.waits.items():
        reason = plan.reason_for(job_id)
        assert reason is not None and reason.code is code, (job_id, reason)
    for job_id, words in case.says.items():
        message = said_about(plan, job_id)
        assert words in message, (job_id, message)
    for job_id, nodes in case.on.items():
        assert driver.node_of(job_id) == nodes
    for tenant, gpus in case.used.items():
        assert driver.state.used(tenant, "H100") == gpus
    return plan


def said_about(plan: Plan, job_id: str) -> str:
    """The reason ``plan`` gives for preempting, admitting or keeping ``job_id`` waiting."""
    for preemption in plan.preemptions:
        if preemption.job_id == job_id:
            return preemption.reason
    for admission in plan.admissions:
        if admission.job_id == job_id:
            return admission.reason
    reason = plan.reason_for(job_id)
    return reason.message if reason else ""


def prune_step_by_step(index: Any, job: Job, freed: list[Any], placement: Any) -> Any:
    """The victim search's original give-back loop for a one-unit gang (what
    ``preemption.release._prune_one_unit`` must match): after each give-back the one-node fit
    test, then a full placement search. Drops the victims given back from ``freed``."""
    from aicluster.core import Placement
    from aicluster.scheduler import find_placement
    from aicluster.scheduler.preemption import release

    fits = release._one_node_fit_test(index, job)
    assert fits is not None
    for position in range(len(freed) - 2, -1, -1):
        slots = freed[position].placement.slots
        index.allocate(slots)
        if not fits():
            index.release(slots)
            continue
        found = find_placement(index, job, explain=False)
        assert isinstance(found, Placement)
        del freed[position]
        placement = found
    return placement


def service_job(
    job_id: str,
    state: JobState,
    node: str | None,
    version: int = 1,
    resources: dict[str, Any] | None = None,
) -> JobRecord:
    """A stored service job of team's gpt ``version`` (placed on ``node`` when given)."""
    spec = jobspec_from_mapping(
        {"name": "svc", "module": "m", "tenant": "team", "resources": resources or {}}
    )
    placement = None
    if node is not None:
        placement = {"level": "node", "domain": node, "slots": [[node, 1, 0]], "score": {}}
    return JobRecord(
        id=job_id,
        tenant="team",
        name="svc",
        spec=spec,
        spec_hash="h",
        state=state,
        priority=200,
        submitted_by="serving",
        submitted_at=0.0,
        updated_at=0.0,
        placement=placement,
        kind="service",
        service={"model": "gpt", "version": version},
    )
