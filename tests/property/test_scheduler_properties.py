"""Invariants of the scheduler over random clusters, tenants and workloads (Hypothesis)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aicluster.configuration import parse_configuration, scheduler_config
from aicluster.core import (
    Cluster,
    DomainLevel,
    Job,
    NodeShape,
    Parallelism,
    Plan,
    Tenant,
    make_cluster,
)
from aicluster.core.resources import memory_mib, millicpus
from aicluster.scheduler import (
    FreeIndex,
    SchedulerConfig,
    SchedulerState,
    effects,
    make_state,
    names,
    schedule,
)

POLICIES = names()


@dataclass(frozen=True)
class Scenario:
    nodes: int
    gpus_per_node: int
    nodes_per_rack: int
    nvlink: int
    cpus_per_node: float
    memory_gb_per_node: float
    tenants: dict[str, Tenant]
    jobs: list[Job]
    policy: str
    backfill: str
    seed: int


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    gpus = draw(st.sampled_from([2, 4, 8]))
    nvlink = draw(st.sampled_from([0, gpus // 2]))
    tenant_names = ["a", "b", "c"][: draw(st.integers(1, 3))]
    with_quota = draw(st.booleans())
    # Some scenarios place CPUs and memory too: jobs ask for them (some for no GPU at all),
    # nodes have few enough that they run out, tenants may be capped.
    with_host = draw(st.booleans())
    cpu_caps = [None, 4.0, 12.0] if with_host else [None]
    tenants = {
        name: Tenant(
            name,
            quota={"H100": draw(st.integers(0, 16))} if with_quota else {},
            borrow_limit={"H100": draw(st.integers(0, 16))} if with_quota else {},
            weight=draw(st.sampled_from([1.0, 2.0])),
            cpu_quota=draw(st.sampled_from(cpu_caps)),
        )
        for name in tenant_names
    }
    jobs = []
    for i in range(draw(st.integers(1, 25))):
        per_worker = draw(st.sampled_from([0, 1, 2, gpus] if with_host else [1, 2, gpus]))
        tensor = draw(st.sampled_from([1, max(per_worker, 1)]))
        workers = draw(st.integers(1, 4))
        jobs.append(
            Job(
                id=f"j{i}",
                tenant=draw(st.sampled_from(tenant_names)),
                workers=workers,
                min_workers=draw(st.one_of(st.none(), st.integers(1, workers))),
                gpus_per_worker=per_worker,
                cpus_per_worker=draw(st.sampled_from([0.0, 1.0, 2.5, 8.0] if with_host else [0.0])),
                memory_gb_per_worker=draw(
                    st.sampled_from([0.0, 4.0, 30.0] if with_host else [0.0])
                ),
                parallelism=Parallelism(tensor=tensor),
                priority=draw(st.sampled_from([100, 200, 300])),
                submit_time=float(i),
                true_duration=float(draw(st.integers(1, 50))),
                max_domain=draw(st.sampled_from(list(DomainLevel))),
                preemptible=draw(st.booleans()),
            )
        )
    return Scenario(
        nodes=draw(st.integers(1, 6)),
        gpus_per_node=gpus,
        nodes_per_rack=draw(st.integers(1, 3)),
        nvlink=nvlink,
        cpus_per_node=draw(st.sampled_from([8.0, 16.0])) if with_host else 64.0,
        memory_gb_per_node=draw(st.sampled_from([32.0, 64.0])) if with_host else 512.0,
        tenants=tenants,
        jobs=jobs,
        policy=draw(st.sampled_from(POLICIES)),
        backfill=draw(st.sampled_from(["easy", "none"])),
        seed=draw(st.integers(0, 1000)),
    )


def cluster_of(scenario: Scenario) -> Cluster:
    return make_cluster(
        nodes=scenario.nodes,
        gpus_per_node=scenario.gpus_per_node,
        nodes_per_rack=scenario.nodes_per_rack,
        racks_per_pod=2,
        shape=NodeShape(
            nvlink_domain_size=scenario.nvlink,
            cpus=scenario.cpus_per_node,
            memory_gb=scenario.memory_gb_per_node,
        ),
    )


def run(scenario: Scenario, check: bool = True) -> list[tuple[object, ...]]:
    """Replay the scenario: arrivals, cycles, random completions. Returns a trace of decisions."""
    config = SchedulerConfig(queue=scenario.policy, backfill=scenario.backfill)
    return replay(scenario, config, stop_rate=0.3, check=check)


def replay(
    scenario: Scenario,
    config: SchedulerConfig,
    *,
    stop_rate: float,
    check: bool = False,
    layout: bool = False,
    cached: dict[str, list[str]] | None = None,
) -> list[tuple[object, ...]]:
    """Each step: the step's arrival, running jobs ending at ``stop_rate``, one cycle applied.
    ``check``: the invariants after every cycle; ``layout``: each trace entry also records the
    free-capacity index (its counts and the order of nodes in its buckets, which best fit
    breaks ties by); ``cached``: the input shards nodes report holding (data locality)."""
    cluster = cluster_of(scenario)
    state = make_state(cluster, dict(scenario.tenants), config)
    for node, shards in (cached or {}).items():
        state.set_node_shards(node, shards)
    rng = random.Random(scenario.seed)
    trace: list[tuple[object, ...]] = []
    for step, job in enumerate(scenario.jobs + [None] * 10):  # type: ignore[list-item]
        now = float(step)
        if job is not None:
            state.submit(job, now)
        for job_id in sorted(state.running):
            if rng.random() < stop_rate:
                state.stop(job_id, now, requeue=False)
        state.refresh(now)
        before = state.digest()
        plan = schedule(state.snapshot(now))
        if check:
            assert state.digest() == before, "schedule() changed its snapshot"
            check_plan(state, plan)
        for preempt in plan.preemptions:
            state.stop(preempt.job_id, now, requeue=True)
        for admit in plan.admissions:
            state.start(admit.job_id, admit.placement, now)
        if check:
            check_state(state)
        decisions = (
            tuple((a.job_id, a.placement.slots) for a in plan.admissions),
            tuple(p.job_id for p in plan.preemptions),
        )
        trace.append(decisions + _layout(state.index) if layout else decisions)
    return trace


def _layout(index: FreeIndex) -> tuple[object, ...]:
    # Nodes with no free GPU are in no order a search reads (every walk starts at a bucket of
    # at least one free GPU), so only the other buckets' order is recorded.
    buckets = tuple(tuple(tuple(b) for b in index.buckets[t][1:]) for t in index.gpu_types)
    return (index.digest(), buckets)


def check_plan(state: SchedulerState, plan: Plan) -> None:
    nodes = {node.name: node for node in state.cluster.nodes}
    preempted = {p.job_id for p in plan.preemptions}
    assert preempted <= set(state.running)
    for job_id in preempted:
        assert state.running[job_id].job.preemptible
    for admit in plan.admissions:
        job = state.pending[admit.job_id].job
        if admit.workers is not None:  # an elastic job started smaller, never below its minimum
            assert job.min_workers is not None and job.min_workers <= admit.workers < job.workers
            job = job.resized(admit.workers)
        slots = admit.placement.slots
        # Gangs are all or nothing: every unit placed, each whole on one node.
        assert len(slots) == job.units
        assert sum(slot.gpus for slot in slots) == job.total_gpus
        assert all(slot.gpus == job.unit_gpus for slot in slots)
        assert sum(millicpus(slot.cpus) for slot in slots) == job.total_millicpus
        assert sum(memory_mib(slot.memory_gb) for slot in slots) == job.total_memory_mib
        # (Without GPUs an NVLink domain means nothing: such a job keeps to one node.)
        widest = job.max_domain if job.total_gpus else max(job.max_domain, DomainLevel.NODE)
        assert admit.placement.level <= widest
        types = {nodes[slot.node].gpu_type for slot in slots}
        assert len(types) == 1 or not job.total_gpus
        if job.needs_nvlink:
            assert all(slot.nvlink_domain >= 0 for slot in slots)
            assert all(job.unit_gpus <= nodes[slot.node].nvlink_size for slot in slots)
    for job_id in state.pending:
        if job_id not in {a.job_id for a in plan.admissions}:
            reason = plan.reason_for(job_id)
            assert reason is not None and reason.message


def check_state(state: SchedulerState) -> None:
    used: dict[str, int] = {}
    used_nvlink: dict[tuple[str, int], int] = {}
    used_host: dict[str, tuple[int, int]] = {}
    for running in state.running.values():
        for slot in running.placement.slots:
            used[slot.node] = used.get(slot.node, 0) + slot.gpus
            cpus, memory = used_host.get(slot.node, (0, 0))
            used_host[slot.node] = (
                cpus + millicpus(slot.cpus),
                memory + memory_mib(slot.memory_gb),
            )
            if slot.nvlink_domain >= 0:
                key = (slot.node, slot.nvlink_domain)
                used_nvlink[key] = used_nvlink.get(key, 0) + slot.gpus
    for i, node in enumerate(state.cluster.nodes):
        # Never over-allocate a node's GPUs, and the index agrees with the placements.
        assert used.get(node.name, 0) <= node.gpus
        assert state.index.free[i] == node.gpus - used.get(node.name, 0)
        for domain in range(node.nvlink_domains):
            assert used_nvlink.get((node.name, domain), 0) <= node.nvlink_size
        # CPUs and memory likewise.
        cpus, memory = used_host.get(node.name, (0, 0))
        assert state.index.free_millicpus[i] == millicpus(node.cpus) - cpus >= 0
        assert state.index.free_memory_mib[i] == memory_mib(node.memory_gb) - memory >= 0
    for name, tenant in state.tenants.items():
        if tenant.cpu_quota is not None:
            held = sum(
                r.job.total_millicpus for r in state.running.values() if r.job.tenant == name
            )
            assert held <= millicpus(tenant.cpu_quota), f"tenant {name} over its CPU cap"
        if not tenant.has_quota:
            continue
        for gpu_type in state.capacity_by_type:
            limit = tenant.quota_for(gpu_type) + tenant.borrow_limit_for(gpu_type)
            assert state.used(name, gpu_type) <= limit, f"tenant {name} over quota and limit"


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(scenarios())
def test_invariants_hold_for_every_plan(scenario: Scenario) -> None:
    run(scenario)


@settings(max_examples=40, deadline=None)
@given(scenarios())
def test_identical_inputs_give_identical_decisions(scenario: Scenario) -> None:
    assert run(scenario, check=False) == run(scenario, check=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_reclaims_settle_when_nothing_changes(scenario: Scenario) -> None:
    """With every job submitted and nothing finishing, reclaim preemptions stop: a tenant that
    reclaimed its quota is never reclaimed from in turn (no ping-pong between tenants)."""
    reclaimed = _reclaims_per_cycle(scenario)
    assert reclaimed[-3:] == [0, 0, 0], reclaimed


def _reclaims_per_cycle(scenario: Scenario) -> list[int]:
    """Reclaim preemptions in each cycle, with every job submitted and nothing finishing."""
    cluster = cluster_of(scenario)
    config = SchedulerConfig(queue="fifo", backfill=scenario.backfill, preemption=True)
    state = make_state(cluster, dict(scenario.tenants), config)
    for job in scenario.jobs:
        state.submit(job, 0.0)
    reclaimed: list[int] = []
    for _ in range(len(scenario.jobs) + 4):
        state.refresh(0.0)
        plan = schedule(state.snapshot(0.0))
        reclaimed.append(sum(p.kind == "reclaim" for p in plan.preemptions))
        for preempt in plan.preemptions:
            state.stop(preempt.job_id, 0.0, requeue=True)
        for admit in plan.admissions:
            state.start(admit.job_id, admit.placement, 0.0)
    return reclaimed


#: Found by the test above on 2026-12-05 (and failing on 3ece336 too): one 4-GPU node, tenant
#: b (quota 1) and a (quota 0, borrowing), b's 2x2-GPU job and a's unpreemptible 1-GPU jobs;
#: reclaims did not stop (the rights before issue 34). Kept as it was drawn: it settles now.
RECLAIMS_DO_NOT_SETTLE = Scenario(
    nodes=1,
    gpus_per_node=4,
    nodes_per_rack=1,
    nvlink=0,
    cpus_per_node=64.0,
    memory_gb_per_node=512.0,
    tenants={
        "a": Tenant(
            name="a",
            quota={"H100": 0},
            borrow_limit={"H100": 4},
            weight=1.0,
            cpu_quota=None,
            memory_quota_gb=None,
        ),
        "b": Tenant(
            name="b",
            quota={"H100": 1},
            borrow_limit={"H100": 4},
            weight=1.0,
            cpu_quota=None,
            memory_quota_gb=None,
        ),
    },
    jobs=[
        Job(
            id="j0",
            tenant="b",
            workers=2,
            gpus_per_worker=2,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=200,
            submit_time=0.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=True,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j1",
            tenant="a",
            workers=3,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=1.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=True,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j2",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=2.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=False,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j3",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=3.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=False,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j4",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=4.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=False,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j5",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=5.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=False,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j6",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=6.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NODE,
            preemptible=False,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j7",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=300,
            submit_time=7.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=True,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j8",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=8.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=False,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j9",
            tenant="a",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=9.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=False,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
        Job(
            id="j10",
            tenant="b",
            workers=1,
            gpus_per_worker=1,
            gpu_type="any",
            cpus_per_worker=0.0,
            memory_gb_per_worker=0.0,
            priority=100,
            submit_time=10.0,
            duration_estimate=None,
            checkpoint_interval=None,
            parallelism=Parallelism(data=1, tensor=1, pipeline=1),
            max_domain=DomainLevel.NVLINK,
            preemptible=True,
            true_duration=1.0,
            min_workers=None,
            data=(),
        ),
    ],
    policy="fair",
    backfill="easy",
    seed=0,
)


def test_reclaims_settle_in_the_case_found_on_2026_12_05() -> None:
    assert _reclaims_per_cycle(RECLAIMS_DO_NOT_SETTLE)[-3:] == [0, 0, 0]


def _short_thresholds(
    scenario: Scenario,
    *,
    explain: bool,
    shortcuts: bool = True,
    max_victims: int = 512,
    legacy: bool = False,
) -> SchedulerConfig:
    """The scenario's policy with Tiresias thresholds short enough to cross in a replay, from a
    configuration file as a user writes one (``scheduler.shortcuts`` among its keys;
    ``legacy``: the rights before issue 34, written out, without protections; else protections
    as short as the thresholds, so both paths hold victims back and let them go)."""
    rights = "{borrowing: {priority: borrowed, policy: borrowed}, by_standing: false}"
    protect = "min_runtime_s: 0\n  cooldown_s: 0" if legacy else "min_runtime_s: 3\n  cooldown_s: 2"
    text = f"""
policy:
  name: {scenario.policy}
  tiresias: {{thresholds_gpu_s: [4, 40], promote_knob: 2}}
backfill: {scenario.backfill}
scheduler:
  shortcuts: {str(shortcuts).lower()}
preemption:
  max_victims: {max_victims}
  rights: {rights if legacy else "{}"}
  {protect}
"""
    configuration, _ = parse_configuration(text, "scenario.yaml")
    return scheduler_config(configuration, explain=explain)


def _replay_without_reasons(
    scenario: Scenario, *, shortcuts: bool, max_victims: int = 512, legacy: bool = False
) -> list[tuple[object, ...]]:
    """Like :func:`run` with the simulator's settings (no per-job reasons), recording each
    cycle's decisions and the free-capacity index's layout."""
    config = _short_thresholds(
        scenario, explain=False, shortcuts=shortcuts, max_victims=max_victims, legacy=legacy
    )
    return replay(scenario, config, stop_rate=0.2, layout=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenarios(),
    st.sampled_from(["tiresias", "tiresias", "srtf", None]),
    st.sampled_from([512, 512, 1, 2, 3]),
)
def test_the_shortcuts_decide_what_the_plain_path_decides(
    scenario: Scenario, policy: str | None, max_victims: int
) -> None:
    """Every shortcut (the policies' bulk forms, victim searches answered from the capacity
    histograms and their round trips replayed, candidate lists shared, stopping once no later
    job can preempt or fit, placements and failures remembered, give-backs decided on counts)
    switched off by the configuration gives the same decisions and leaves the index laid out
    the same way, with the default ``max_victims`` and with small ones."""
    if policy is not None:  # mostly the preemptive policies, where the shortcuts are
        scenario = replace(scenario, policy=policy)
    fast = _replay_without_reasons(scenario, shortcuts=True, max_victims=max_victims)
    plain = _replay_without_reasons(scenario, shortcuts=False, max_victims=max_victims)
    assert fast == plain


def test_one_tenants_failed_victim_search_is_not_another_tenants() -> None:
    """Found by the test above: with quotas, tenant c's j3 and tenant a's j4 (the same shape)
    list the same running jobs, c's by reclaim (released only while their tenant borrows), a's
    by Tiresias' right. c's search fails; the failed-search memo keyed by shape and victims
    alone then failed a's too, where the plain path preempts j0 and j1 for j4. Under the rights
    before issue 34 (a borrower, a, takes b's in-quota j0): the memo must tell rights apart
    whichever rights are configured."""

    def job(n: int, tenant: str, workers: int, gpus: int, preemptible: bool = False) -> Job:
        return Job(
            id=f"j{n}",
            tenant=tenant,
            workers=workers,
            gpus_per_worker=gpus,
            priority=100,
            submit_time=float(n),
            max_domain=DomainLevel.NVLINK,
            preemptible=preemptible,
            true_duration=1.0,
        )

    quotas = {"a": (0, 6), "b": (4, 4), "c": (6, 0)}
    tenants = {
        name: Tenant(name, quota={"H100": quota}, borrow_limit={"H100": borrow})
        for name, (quota, borrow) in quotas.items()
    }
    jobs = [job(0, "b", 2, 2, True), job(1, "b", 2, 2, True), job(2, "a", 1, 1)]
    jobs += [job(3, "c", 3, 2), job(4, "a", 3, 2), job(5, "a", 1, 1), job(6, "a", 1, 1)]
    scenario = Scenario(1, 8, 1, 0, 64.0, 512.0, tenants, jobs, "tiresias", "easy", 0)
    plain = _replay_without_reasons(scenario, shortcuts=False, legacy=True)
    assert any(cycle[1] == ("j0", "j1") for cycle in plain)  # j4 preempts them
    assert _replay_without_reasons(scenario, shortcuts=True, legacy=True) == plain


def _replay_through_the_effects(scenario: Scenario, explain: bool) -> list[tuple[object, ...]]:
    """The scenario applied as both control loops apply plans (``scheduler.effects``): a
    preempted job interrupted by the lost-work rule and requeued with its progress, completions
    at random. Records each cycle's decisions."""
    config = _short_thresholds(scenario, explain=explain)
    state = make_state(cluster_of(scenario), dict(scenario.tenants), config)
    rng = random.Random(scenario.seed)
    trace: list[tuple[object, ...]] = []
    for step, job in enumerate(scenario.jobs + [None] * 10):  # type: ignore[list-item]
        now = float(step)
        if job is not None:
            state.submit(replace(job, checkpoint_interval=3.0), now)
        for job_id in sorted(state.running):
            if rng.random() < 0.2:
                effects.complete(state, job_id, now)
        state.refresh(now)
        plan = schedule(state.snapshot(now))
        for preempt in plan.preemptions:
            running = state.running[preempt.job_id]
            stopped = effects.interrupt(
                state, preempt.job_id, now, saved_at=running.last_checkpoint(now)
            )
            effects.requeue_at_once(state, stopped, now)
        for admit in plan.admissions:
            effects.admit(state, admit.job_id, admit.placement, now)
        trace.append(
            (
                tuple((a.job_id, a.placement.slots) for a in plan.admissions),
                tuple(p.job_id for p in plan.preemptions),
                tuple(sorted((j, e.executed_seconds) for j, e in state.pending.items())),
            )
        )
    return trace


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["tiresias", "srtf", "priority", None]))
def test_the_simulators_quiet_cycles_decide_what_the_live_loops_explained_ones_do(
    scenario: Scenario, policy: str | None
) -> None:
    """The simulator runs cycles without per-job reasons (``explain=False``) and the live loop
    with them; applied through the same effects, they make the same decisions (mostly with the
    preemptive policies, where requeued progress changes the order)."""
    if policy is not None:
        scenario = replace(scenario, policy=policy)
    assert _replay_through_the_effects(scenario, explain=False) == _replay_through_the_effects(
        scenario, explain=True
    )
