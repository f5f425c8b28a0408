"""The scheduler's fast paths decide exactly what the plain searches they replace decided."""

from __future__ import annotations

import math
import random

import pytest

from aicluster.core import (
    Cluster,
    DomainLevel,
    Job,
    Node,
    NodeShape,
    PendingCode,
    Plan,
    Slot,
    make_cluster,
)
from aicluster.scheduler import (
    FreeIndex,
    PlacementFailure,
    SchedulerConfig,
    SchedulerState,
    find_placement,
    make_policy,
    make_state,
    schedule,
)
from aicluster.scheduler import cycle as cycle_module
from aicluster.scheduler import early_stop as early_stop_module
from aicluster.scheduler.backfill import _candidate_groups
from aicluster.scheduler.preemption import release as release_module
from aicluster.scheduler.preemption import search as preemption_module
from builders import prune_step_by_step


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


def _mixed_cluster(rng: random.Random, count: int = 12) -> Cluster:
    """Nodes of 4 or 8 GPUs and two types in racks of 3 and pods of 2 racks."""
    nodes = [
        Node(f"n{i}", rng.choice([4, 8, 8]), rng.choice(["A", "B"]), f"r{i // 3}", f"p{i // 6}")
        for i in range(count)
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
    assert failure.code is PendingCode.NO_CAPACITY
    assert failure.message == "needs 8 GPUs; the cluster has 16 GPUs, 4 free"
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


def test_the_content_version_moves_with_free_gpus_not_with_bucket_order() -> None:
    index = FreeIndex(make_cluster(nodes=2))
    content = index.content_version
    with index.tentative():
        assert index.round_trip([[Slot("node-0", 2)], [Slot("node-1", 1)]])
        assert index.content_version == content  # only the buckets' order moved
        index.allocate([Slot("node-0", 2)])
        assert index.content_version > content
    changed = index.content_version
    index.set_schedulable("node-1", False)
    assert index.content_version > changed


@pytest.mark.parametrize("seed", range(20))
def test_tiresias_bulk_answers_are_its_per_victim_answers(seed: int) -> None:
    """Tiresias' shortcuts victim_ranks and may_preempt_each (the victim search's hot path)
    give exactly what its plain victim_rank and may_preempt give, victim by victim."""
    from aicluster.scheduler.entries import PendingEntry, RunningEntry
    from aicluster.scheduler.shortcuts import shortcuts_for

    rng = random.Random(seed)
    config = SchedulerConfig(queue="tiresias", tiresias_thresholds=(3600.0, 36000.0))
    policy = make_policy(config)
    shortcuts = shortcuts_for(policy, enabled=True)
    placement = find_placement(FreeIndex(make_cluster(nodes=1)), Job(id="p", tenant="t"))
    assert not isinstance(placement, PlacementFailure)
    victims = []
    for k in range(30):
        job = Job(
            id=f"v{k}",
            tenant="t",
            gpus_per_worker=rng.choice((1, 2, 4, 8)),
            checkpoint_interval=rng.choice((None, 0.0, 600.0, 1234.5)),
        )
        started = rng.uniform(0.0, 50_000.0)
        victims.append(
            RunningEntry(
                job,
                job,
                k,
                placement,
                "gpu",
                started,
                attained_before=rng.choice((0.0, rng.uniform(0.0, 40_000.0))),
                last_checkpoint_at=rng.choice((0.0, started + rng.uniform(-10.0, 900.0))),
            )
        )
    for now in (0.0, 1e4, rng.uniform(0.0, 1e5), 1e5 + 0.1):
        ranks = [policy.victim_rank(v, now) for v in victims]
        assert shortcuts.victim_ranks(victims, now) == ranks
        for queue in (0.0, 1.0, 2.0):
            entry = PendingEntry(Job(id="w", tenant="t"), 0, 0.0, key=(queue, 0.0))
            expected = [policy.may_preempt(entry, v, now) for v in victims]
            assert shortcuts.may_preempt_each(entry, victims, now) == expected
            for victim in victims:  # a class given at any earlier time
                given = rng.uniform(victim.started_at, max(victim.started_at, now))
                running_class = policy.running_class(victim, given)
                if shortcuts.preempts_whole_class(entry, running_class):
                    assert policy.may_preempt(entry, victim, now)


@pytest.mark.parametrize("seed", range(20))
def test_the_content_hash_is_a_function_of_the_free_gpus(seed: int) -> None:
    # Any path back to the same free GPUs (and schedulable nodes) gives the same hash; a change
    # gives another (64-bit keys: a collision in these few hundred steps would be a bug).
    rng = random.Random(seed)
    index = FreeIndex(_mixed_cluster(rng))
    by_content: dict[tuple[object, ...], int | None] = {}
    for _ in range(300):
        i = rng.randrange(len(index.nodes))
        name = index.nodes[i].name
        if rng.random() < 0.1:
            index.set_schedulable(name, not index.schedulable[i])
        elif index.free[i] and rng.random() < 0.5:
            index.allocate([Slot(name, rng.randint(1, index.free[i]))])
        elif index.free[i] < index.nodes[i].gpus:
            index.release([Slot(name, rng.randint(1, index.nodes[i].gpus - index.free[i]))])
        content = (tuple(index.free), tuple(index.schedulable))
        assert by_content.setdefault(content, index.content_hash) == index.content_hash
    assert len(set(by_content.values())) == len(by_content)


def _one_node_six_gpus_busy() -> SchedulerState:
    state = make_state(make_cluster(nodes=1), config=SchedulerConfig(queue="fifo", explain=True))
    state.submit(Job(id="big", tenant="x", gpus_per_worker=6), 0.0)
    plan = schedule(state.snapshot(0.0))
    state.start("big", plan.admissions[0].placement, 0.0)
    return state


def _count_searches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the jobs the cycle runs a placement search for, in order."""
    searches: list[str] = []
    real = cycle_module.find_placement

    def counted(index: FreeIndex, job: Job, **options: object) -> object:
        searches.append(job.id)
        return real(index, job, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle_module, "find_placement", counted)
    return searches


@pytest.mark.parametrize("seed", range(10))
def test_reserved_nodes_from_memory_are_the_ones_worked_out_afresh(seed: int) -> None:
    from aicluster.scheduler.backfill import _reserved_nodes

    rng = random.Random(seed)
    index = FreeIndex(_mixed_cluster(rng))
    jobs = [
        Job(id=f"j{k}", tenant="t", workers=w, gpus_per_worker=g, gpu_type=t, max_domain=d)
        for k, (w, g, t, d) in enumerate(
            [
                (1, 4, "A", DomainLevel.NODE),
                (2, 4, "B", DomainLevel.RACK),
                (3, 8, "any", DomainLevel.CLUSTER),
            ]
        )
    ]
    for _ in range(200):
        i = rng.randrange(len(index.nodes))
        name = index.nodes[i].name
        if index.free[i] and rng.random() < 0.5:
            index.allocate([Slot(name, rng.randint(1, index.free[i]))])
        elif index.free[i] < index.nodes[i].gpus:
            index.release([Slot(name, rng.randint(1, index.nodes[i].gpus - index.free[i]))])
        for job in jobs:
            types = [t for t in index.gpu_types if job.gpu_type in ("any", t)]
            remembered = _reserved_nodes(index, job, types)  # from memory where seen before
            saved, index.content_memo = index.content_memo, {}
            assert _reserved_nodes(index, job, types) == remembered
            index.content_memo = saved


def test_a_placement_failure_is_answered_from_memory_in_a_later_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = _one_node_six_gpus_busy()
    state.submit(Job(id="wide", tenant="y", gpus_per_worker=4, submit_time=1.0), 1.0)
    searches = _count_searches(monkeypatch)
    first = schedule(state.snapshot(1.0))
    # A new arrival changes no free GPU: the next cycle knows "wide" fails without a search.
    state.submit(Job(id="later", tenant="z", gpus_per_worker=4, submit_time=2.0), 2.0)
    second = schedule(state.snapshot(2.0))
    assert searches.count("wide") == 1
    assert second.pending["wide"] == first.pending["wide"]
    # Once the GPUs change, it searches again (and now fits).
    state.stop("big", 3.0, requeue=False)
    third = schedule(state.snapshot(3.0))
    assert searches.count("wide") == 2
    assert [admit.job_id for admit in third.admissions][:1] == ["wide"]


def test_lanes_of_one_shape_share_a_failed_search_while_nothing_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = _one_node_six_gpus_busy()
    for tenant in "abc":  # one lane per tenant, all of the same shape
        state.submit(Job(id=tenant, tenant=tenant, gpus_per_worker=4, submit_time=1.0), 1.0)
    searches = _count_searches(monkeypatch)
    plan = schedule(state.snapshot(1.0))
    assert plan.admissions == []
    # a fails and reserves the node; b searches once against the reservation; c reuses that.
    assert searches == ["a", "b"]
    assert plan.pending["b"] == plan.pending["c"]
    assert state.tenant("a") is state.tenant("a")


def test_an_unknown_reservation_start_admits_no_one() -> None:
    from aicluster.scheduler.backfill import Reservation

    job = Job(id="short", tenant="t", duration_estimate=10.0)
    assert not Reservation("head", frozenset({0}), math.inf).admits(job, 0.0)
    assert Reservation("head", frozenset({0}), 100.0).admits(job, 0.0)


def _blocked_behind_a_reservation(explain: bool) -> tuple[SchedulerState, Plan]:
    """One 8-GPU node with 6 GPUs busy: the 4-GPU head reserves the node, so its 2 free GPUs
    are held for it and the jobs behind (2 GPUs each) must wait."""
    state = make_state(make_cluster(nodes=1), config=SchedulerConfig(queue="fifo", explain=explain))
    state.submit(Job(id="busy", tenant="x", gpus_per_worker=6), 0.0)
    state.start("busy", schedule(state.snapshot(0.0)).admissions[0].placement, 0.0)
    state.submit(Job(id="head", tenant="x", gpus_per_worker=4, submit_time=1.0), 1.0)
    for name in "abc":
        state.submit(Job(id=name, tenant=name, gpus_per_worker=2, submit_time=2.0), 2.0)
    return state, schedule(state.snapshot(2.0))


def test_without_explanations_a_cycle_stops_when_only_reserved_gpus_are_free() -> None:
    _, quiet = _blocked_behind_a_reservation(explain=False)
    _, explained = _blocked_behind_a_reservation(explain=True)
    assert quiet.admissions == explained.admissions == []
    assert quiet.examined == 1 and explained.examined == 4
    assert explained.pending["a"].code is PendingCode.RESERVATION


def _two_eight_gpu_jobs_facing_victims(
    monkeypatch: pytest.MonkeyPatch, sizes: tuple[int, ...], nvlink: int = 0
) -> tuple[Plan, list[str]]:
    """Jobs of ``sizes`` GPUs run on 4-GPU nodes and sink to Tiresias' second queue; then two
    tenants' 8-GPU jobs arrive: no node has 8 GPUs, whatever is preempted. Returns the plan and
    the jobs for which the victim search ran."""
    config = SchedulerConfig(
        queue="tiresias", tiresias_thresholds=(1.0,), explain=False, min_runtime_s=0, cooldown_s=0
    )
    cluster = make_cluster(
        nodes=len(sizes), gpus_per_node=4, shape=NodeShape(nvlink_domain_size=nvlink)
    )
    state = make_state(cluster, config=config)
    for k, gpus in enumerate(sizes):
        state.submit(Job(id=f"r{k}", tenant="x", gpus_per_worker=gpus), 0.0)
    for admit in schedule(state.snapshot(0.0)).admissions:
        state.start(admit.job_id, admit.placement, 0.0)
    for tenant in "ab":
        state.submit(Job(id=tenant, tenant=tenant, gpus_per_worker=8, submit_time=5.0), 5.0)
    searches: list[str] = []
    real = preemption_module.free_until_fits

    def counted(context: object, job: Job, *args: object) -> object:
        searches.append(job.id)
        return real(context, job, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(preemption_module, "free_until_fits", counted)
    state.refresh(10.0)
    return schedule(state.snapshot(10.0)), searches


def test_a_failed_victim_search_is_reused_for_the_same_shape_and_candidates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NVLink-split nodes: the search must run (its round trip is not replayed over splits).
    plan, searches = _two_eight_gpu_jobs_facing_victims(monkeypatch, (4, 2), nvlink=2)
    assert plan.preemptions == [] and plan.admissions == []
    assert searches == ["a"]  # b: same shape, same candidates, same index


def test_a_hopeless_victim_search_is_replayed_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A victim holds a node with free GPUs: the search's round trip is replayed on the index
    (test_the_fast_paths_decide_what_the_plain_searches_decide checks it is exactly so)."""
    plan, searches = _two_eight_gpu_jobs_facing_victims(monkeypatch, (4, 2))
    assert plan.preemptions == [] and plan.admissions == []
    assert searches == []


def test_a_hopeless_victim_search_on_full_nodes_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Victims that hold only full nodes: their round trip would change nothing a search reads,
    so the capacity test alone answers."""
    plan, searches = _two_eight_gpu_jobs_facing_victims(monkeypatch, (4, 4))
    assert plan.preemptions == [] and plan.admissions == []
    assert searches == []


@pytest.mark.parametrize("seed", range(60))
def test_the_all_victims_fit_test_agrees_with_releasing_them_and_searching(seed: int) -> None:
    """_fits_if_all_freed answers exactly what find_placement answers once every candidate's
    GPUs are released (for gangs without NVLink groups), without touching the index."""
    from aicluster.core import DomainLevel, Placement
    from aicluster.scheduler.entries import RunningEntry

    rng = random.Random(seed)
    nodes = [  # rack names repeat across pods: a rack domain may span two pods
        Node(f"n{i}", rng.choice([4, 8, 8]), rng.choice(["A", "B"]), f"r{i % 3}", f"p{i // 6}")
        for i in range(12)
    ]
    index = FreeIndex(Cluster("mixed", tuple(nodes)))
    running: list[RunningEntry] = []
    for k in range(rng.randint(0, 10)):
        node = rng.choice(nodes)
        take = min(rng.randint(1, node.gpus), index.free[index.node_id[node.name]])
        if take == 0:
            continue
        slots = (Slot(node.name, take),)
        index.allocate(slots)
        job = Job(id=f"v{k}", tenant="t", gpus_per_worker=take)
        placement = Placement(slots, DomainLevel.NODE, node.name)
        running.append(RunningEntry(job, job, k, placement, node.gpu_type, 0.0))
    for node in nodes:
        if rng.random() < 0.15:
            index.set_schedulable(node.name, False)
    for _ in range(20):
        unit = rng.choice([1, 2, 4, 8])
        job = Job(
            id="j",
            tenant="t",
            workers=rng.randint(1, 6),
            gpus_per_worker=unit,
            gpu_type=rng.choice(["A", "B", "any"]),
            max_domain=rng.choice(list(DomainLevel)[1:]),
        )
        candidates = rng.sample(running, rng.randint(0, len(running)))
        before = index.digest()
        predicted = preemption_module._fits_if_all_freed(index, job, candidates)
        assert index.digest() == before
        for victim in candidates:
            index.release(victim.placement.slots)
        found = find_placement(index, job)
        for victim in reversed(candidates):
            index.allocate(victim.placement.slots)
        assert predicted == (not isinstance(found, PlacementFailure)), (job, candidates)


def _layout(index: FreeIndex) -> tuple[object, ...]:
    """Everything in the index, bucket order included (best fit takes a bucket's first node)."""
    buckets = {t: [list(bucket) for bucket in index.buckets[t]] for t in index.gpu_types}
    histograms = [d.histogram for d in index.racks + index.pods]
    return index.digest(), buckets, histograms, dict(index.free_by_type), index.watts


@pytest.mark.parametrize("seed", range(40))
def test_a_replayed_round_trip_leaves_the_index_as_the_real_one_does(seed: int) -> None:
    """round_trip() stands in for releasing victims and allocating them back (a failed victim
    search): the buckets' order must match, now and after the cycle's rollback."""
    rng = random.Random(seed)
    cluster = make_cluster(nodes=10, gpus_per_node=8, nodes_per_rack=3, racks_per_pod=2)
    real, replayed = FreeIndex(cluster), FreeIndex(cluster)
    held: list[tuple[Slot, ...]] = []
    for _ in range(14):  # jobs holding GPUs before the cycle
        node = rng.randrange(10)
        take = min(rng.randint(1, 4), real.free[node])
        if take:
            slots = (Slot(f"node-{node}", take),) * rng.randint(1, max(1, real.free[node] // take))
            for index in (real, replayed):
                index.allocate(slots)
            held.append(slots)
    if rng.random() < 0.3:
        for index in (real, replayed):
            index.set_schedulable("node-1", False)
    assert _layout(real) == _layout(replayed)
    with real.tentative(), replayed.tentative():
        for _ in range(3):
            victims = rng.sample(held, rng.randint(1, len(held)))
            for slots in victims:
                real.release(slots)
            for slots in reversed(victims):
                real.allocate(slots)
            assert replayed.round_trip(victims)
            assert _layout(real) == _layout(replayed)
            node = rng.randrange(10)  # a tentative admission between searches
            if real.free[node] and real.schedulable[node]:
                for index in (real, replayed):
                    index.allocate([Slot(f"node-{node}", 1)])
    assert _layout(real) == _layout(replayed)


def test_no_round_trip_is_replayed_over_nvlink_splits_or_fractional_watts() -> None:
    from aicluster.core import GpuPower

    split = FreeIndex(make_cluster(nodes=1, shape=NodeShape(nvlink_domain_size=4)))
    split.allocate([Slot("node-0", 2, 0)])
    assert not split.round_trip([[Slot("node-0", 2, 0)]])
    power = GpuPower(idle_watts=61.5, busy_watts=300.1)
    fractional = FreeIndex(make_cluster(nodes=1, shape=NodeShape(power=power)))
    fractional.allocate([Slot("node-0", 2)])
    assert not fractional.round_trip([[Slot("node-0", 2)]])


@pytest.mark.parametrize("seed", range(40))
def test_a_shape_no_easier_than_a_failed_one_fails_too(seed: int) -> None:
    """The does-anything-fit test skips a shape _no_easier than one that failed: wherever the
    easier one fails (off the reserved nodes), so does the other, on random mixed clusters."""
    from aicluster.core import DomainLevel

    rng = random.Random(seed)
    nodes = [
        Node(f"n{i}", rng.choice([4, 8, 8]), rng.choice(["A", "B"]), f"r{i % 3}", f"p{i // 6}")
        for i in range(12)
    ]
    index = FreeIndex(Cluster("mixed", tuple(nodes)))
    for node in nodes:
        used = rng.randint(0, node.gpus)
        if used:
            index.allocate([Slot(node.name, used)])
        if rng.random() < 0.15:
            index.set_schedulable(node.name, False)
    exclude = frozenset(rng.sample(range(len(nodes)), rng.randint(0, 4)))
    jobs = [
        Job(
            id=f"j{k}",
            tenant="t",
            workers=rng.randint(1, 5),
            gpus_per_worker=rng.choice([1, 2, 3, 4, 8]),
            gpu_type=rng.choice(["A", "B", "any"]),
            max_domain=rng.choice([DomainLevel.NODE, DomainLevel.RACK, DomainLevel.CLUSTER]),
        )
        for k in range(30)
    ]
    fits = {
        job.id: not isinstance(find_placement(index, job, exclude=exclude), PlacementFailure)
        for job in jobs
    }
    compared = 0
    for easier in jobs:
        for other in jobs:
            if not fits[easier.id] and early_stop_module._no_easier(other, easier):
                compared += 1
                assert not fits[other.id], (other, easier)
    assert compared > 0  # the seeds give pairs to compare
    same = Job(id="s", tenant="t", workers=2, gpus_per_worker=4)
    assert early_stop_module._no_easier(Job(id="x", tenant="t", workers=3, gpus_per_worker=4), same)
    assert not early_stop_module._no_easier(
        Job(id="x", tenant="t", workers=4, gpus_per_worker=2), same
    )
    assert not early_stop_module._no_easier(
        Job(id="x", tenant="t", workers=2, gpus_per_worker=4, gpu_type="B"), same
    )


@pytest.mark.parametrize("seed", range(60))
def test_giving_back_victims_on_counts_ends_where_the_step_by_step_search_does(seed: int) -> None:
    """_prune for a one-unit gang decides on free-GPU counts and searches once: the same
    victims given back, the same placement, the same index (bucket order included)."""
    from types import SimpleNamespace

    rng = random.Random(seed)
    cluster = make_cluster(nodes=8, gpus_per_node=8, nodes_per_rack=4, racks_per_pod=2)
    index = FreeIndex(cluster)
    held = []
    for _ in range(rng.randint(4, 16)):  # running jobs, some spanning two nodes
        slots = []
        for node in rng.sample(range(8), rng.choice([1, 1, 2])):
            take = min(rng.randint(1, 4), index.free[node])
            if take:
                slots.append(Slot(f"node-{node}", take))
        if slots:
            index.allocate(slots)
            held.append(SimpleNamespace(placement=SimpleNamespace(slots=tuple(slots))))
    if rng.random() < 0.3:
        index.set_schedulable("node-2", False)
    job = Job(id="waiting", tenant="t", gpus_per_worker=rng.choice([2, 4, 6, 8]))
    freed = []
    for victim in rng.sample(held, len(held)):  # released in rank order until the job fits
        index.release(victim.placement.slots)
        freed.append(victim)
        if not isinstance(find_placement(index, job), PlacementFailure):
            break
    first = find_placement(index, job)
    if isinstance(first, PlacementFailure):
        return  # nothing fits even with every victim gone: no pruning
    import copy

    reference, expected_freed = copy.deepcopy(index), list(freed)
    expected = prune_step_by_step(reference, job, expected_freed, first)
    kept = list(freed)
    got = release_module._prune_one_unit(index, job, kept, first)  # type: ignore[arg-type]
    assert got == expected
    assert [id(v) for v in kept] == [id(v) for v in expected_freed]
    assert _layout(index) == _layout(reference)


def test_the_placement_after_give_backs_is_the_one_found_after_the_last() -> None:
    """Giving back victims can make another node the best fit, and each give-back changes the
    room left: the placement kept is the search's after the last give-back."""
    from types import SimpleNamespace

    index = FreeIndex(make_cluster(nodes=2, gpus_per_node=8))
    running = {
        "v1": (Slot("node-0", 1),),
        "v2": (Slot("node-0", 2),),
        "w": (Slot("node-0", 5), Slot("node-1", 7)),  # a two-node gang
        "x": (Slot("node-1", 1),),  # not a victim
    }
    for slots in running.values():
        index.allocate(slots)
    freed = [
        SimpleNamespace(placement=SimpleNamespace(slots=running[k])) for k in ("v1", "v2", "w")
    ]
    for victim in freed:  # in rank order; only w's release lets a 4-GPU worker fit
        index.release(victim.placement.slots)
    job = Job(id="waiting", tenant="t", gpus_per_worker=4)
    first = find_placement(index, job)
    assert not isinstance(first, PlacementFailure) and first.nodes == ("node-1",)
    import copy

    reference, expected_freed = copy.deepcopy(index), list(freed)
    expected = prune_step_by_step(reference, job, expected_freed, first)
    kept = list(freed)
    got = release_module._prune_one_unit(index, job, kept, first)  # type: ignore[arg-type]
    assert got == expected and got.nodes == ("node-0",)  # node-0, 5 GPUs free: the best fit
    assert got.score["free_left_on_nodes"] == 1.0  # after both give-backs, not after one
    assert len(kept) == len(expected_freed) == 1
    assert _layout(index) == _layout(reference)


@pytest.mark.parametrize("seed", range(40))
def test_domains_by_capacity_come_in_the_order_sorting_every_domain_gives(seed: int) -> None:
    rng = random.Random(seed)
    index = FreeIndex(_mixed_cluster(rng, 24))
    trackers = {
        (rack, unit): index.by_capacity(rack, unit)
        for rack in (True, False)
        for unit in (1, 2, 4, 8)
    }
    held: list[Slot] = []
    for step in range(60):
        node = rng.choice(index.nodes)
        i = index.node_id[node.name]
        if rng.random() < 0.15:
            index.set_schedulable(node.name, not index.schedulable[i])
        elif held and rng.random() < 0.4:
            index.release([held.pop(rng.randrange(len(held)))])
        elif index.free[i]:
            slot = Slot(node.name, rng.randint(1, index.free[i]))
            if step % 7 == 0:
                with index.tentative():  # changed and rolled back: the buckets follow both
                    index.allocate([slot])
            else:
                index.allocate([slot])
                held.append(slot)
        for (rack, unit), tracker in trackers.items():
            assert tracker is not None
            domains = index.racks if rack else index.pods
            types = rng.choice([["A"], ["B"], ["A", "B"]])
            listed = [d for d in domains if d.gpu_type in types]
            units = rng.randint(1, 6)
            fitting = [(d.capacity(unit), p, d) for p, d in enumerate(listed)]
            best_fit = [d for c, _, d in sorted(fitting, key=lambda x: x[:2]) if c >= units]
            assert list(tracker.best_fit(units, types)) == best_fit
            assert tracker.holds(units, types) == bool(best_fit)
            full = [
                d
                for d in listed
                if sum(index.nodes[i].gpus // unit for i in d.nodes if index.schedulable[i])
                >= units
            ]
            freest = sorted(full, key=lambda d: -d.capacity(unit))
            assert list(tracker.freest(units, types)) == freest


def test_with_shortcuts_off_no_domain_buckets_are_kept() -> None:
    index = FreeIndex(make_cluster(nodes=4))
    index.fit_shortcut = False
    assert index.by_capacity(True, 8) is None
