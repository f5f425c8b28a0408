"""The simulator's communication model (``sim.comm``): a gang spread over slower links runs
longer by exactly the configured slowdown, a stopped slowed run keeps the work it did, and a
sensitivity of 0 changes nothing."""

from __future__ import annotations

import pytest

from aicluster.core import ConfigError, DomainLevel, Placement, Slot, parse_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, TraceJob, load_philly, simulate, summarize
from aicluster.sim.comm import CommModel

QUIET = SimConfig(failures=False, restart_overhead=60.0, checkpoint_interval=100.0)
FIFO = SchedulerConfig(queue="fifo")
BANDWIDTH = "bandwidth: {nvlink: 300, node: 60, rack: 30, pod: 10, cluster: 5}"


def two_nodes(racks_per_pod: int, pods: int = 1) -> str:
    """Two 8-GPU nodes (one NVLink domain each): in one rack, two racks, or two pods."""
    per_rack = 2 // (racks_per_pod * pods)
    return (
        "name: two\ndefaults: {gpus: 8, nvlink_domain_size: 8}\n"
        f"layout: {{pods: {pods}, racks_per_pod: {racks_per_pod}, nodes_per_rack: {per_rack}}}\n"
        f"{BANDWIDTH}\n"
    )


# (name, cluster file, GPUs, sensitivity) → the slowdown 1 + s × (bw(nvlink) / bw(span) − 1)
SPREAD = {
    "one node: inside its NVLink domain, full speed": (two_nodes(1), 8, 0.5, 1.0),
    "two nodes of one rack: the rack's 30 GB/s": (two_nodes(1), 16, 0.5, 1 + 0.5 * 9),
    "two racks of one pod: the pod's 10 GB/s": (two_nodes(2), 16, 0.5, 1 + 0.5 * 29),
    "two pods: the cluster's 5 GB/s": (two_nodes(1, pods=2), 16, 0.5, 1 + 0.5 * 59),
    "across racks, a little sensitive": (two_nodes(2), 16, 0.1, 1 + 0.1 * 29),
    "across racks, insensitive: full speed": (two_nodes(2), 16, 0.0, 1.0),
}


@pytest.mark.parametrize(
    ("cluster", "gpus", "sensitivity", "slowdown"), SPREAD.values(), ids=SPREAD
)
def test_a_spread_gang_runs_longer_by_the_configured_slowdown(
    cluster: str, gpus: int, sensitivity: float, slowdown: float
) -> None:
    trace = [TraceJob("j", 0.0, 1000.0, gpus, comm_sensitivity=sensitivity)]
    result = simulate(parse_cluster(cluster), trace, "fifo", config=QUIET)
    assert result.jobs.end[0] == pytest.approx(1000.0 * slowdown)
    assert summarize(result)["slowdown_mean"] == pytest.approx(slowdown)


def test_a_failed_slowed_run_keeps_the_work_its_last_checkpoint_held() -> None:
    """Across two racks at sensitivity 0.5 the job runs at 1/15.5 speed. Node 1 fails at
    1,550 s: the checkpoint at 1,500 s kept 1,500 / 15.5 s of work; after the 4 h repair the job
    restores (60 s) and runs what is left at the same speed."""
    slowdown = 1 + 0.5 * 29
    sim = Simulator(
        parse_cluster(two_nodes(2)),
        [TraceJob("j", 0.0, 1000.0, 16, comm_sensitivity=0.5)],
        scheduler=FIFO,
        config=QUIET,
    )
    sim.inject_failure(1550.0, "node-0001")
    result = sim.run()
    kept = 1500.0 / slowdown
    restart = 1550.0 + QUIET.repair_seconds
    assert result.jobs.end[0] == pytest.approx(restart + 60.0 + (1000.0 - kept) * slowdown)
    assert result.jobs.restarts[0] == 1
    assert result.totals.lost_to_failures == pytest.approx(50.0 * 16)  # wall time since the save


def test_the_size_classes_give_a_trace_without_sensitivities_its_default() -> None:
    model = CommModel(parse_cluster(two_nodes(1)), ((2, 0.1), (16, 0.3)))
    assert [model.by_size(gpus) for gpus in (1, 2, 8, 16, 64)] == [0.0, 0.1, 0.1, 0.3, 0.3]
    classes = SimConfig(failures=False, comm_sensitivity=((16, 0.5),))
    trace = [TraceJob("j", 0.0, 1000.0, 16)]
    result = simulate(parse_cluster(two_nodes(2)), trace, "fifo", config=classes)
    assert result.jobs.end[0] == pytest.approx(1000.0 * (1 + 0.5 * 29))


def test_the_span_of_a_placement_is_its_narrowest_domain() -> None:
    split = parse_cluster(
        "name: s\ndefaults: {gpus: 8, nvlink_domain_size: 4}\nlayout: {nodes_per_rack: 2}\n"
    )
    model = CommModel(split)
    on_one = simulate(split, [TraceJob("a", 0, 10, 4)], "fifo", config=QUIET)
    assert on_one.jobs.end[0] == 10.0
    one_domain = Placement((Slot("node-0000", 4, 1),), DomainLevel.NODE, "node-0000")
    two_domains = Placement((Slot("node-0000", 8, -1),), DomainLevel.NODE, "node-0000")
    two_nodes_ = Placement(
        (Slot("node-0000", 4, 0), Slot("node-0001", 4, 0)), DomainLevel.RACK, "rack-0"
    )
    assert model.span(one_domain) == DomainLevel.NVLINK
    assert model.span(two_domains) == DomainLevel.NODE
    assert model.span(two_nodes_) == DomainLevel.RACK


def test_sensitivity_zero_changes_no_decision() -> None:
    """The first Philly jobs, on a cluster whose links are very slow, with every job's
    sensitivity 0 (by size class and in the trace): the replay is the model-free one."""
    with open("examples/clusters/philly-512.yaml", encoding="utf-8") as handle:
        text = handle.read()
    plain, slow = parse_cluster(text), parse_cluster(text + "bandwidth: {rack: 0.01}\n")
    jobs = load_philly()[:1500]
    zero = SimConfig(comm_sensitivity=((1, 0.0), (16, 0.0)))
    traced = [
        TraceJob(j.id, j.submit_time, j.duration, j.num_gpus, j.tenant, comm_sensitivity=0.0)
        for j in jobs
    ]
    base = simulate(plain, jobs, "tiresias", config=SimConfig())
    for cluster, trace, config in ((slow, jobs, zero), (slow, traced, SimConfig())):
        again = simulate(cluster, trace, "tiresias", config=config)
        assert list(again.jobs.start) == list(base.jobs.start)
        assert list(again.jobs.end) == list(base.jobs.end)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("bandwidth: {rack: 0}", "c.yaml:3: bandwidth.rack must be a positive number of GB/s"),
        ("bandwidth: {pod: fast}", "c.yaml:3: bandwidth.pod must be a positive number"),
        ("bandwidth: {pods: 3}", "c.yaml:3: unknown field 'pods'"),
        ("bandwidth: 25", "c.yaml:3: bandwidth must be a mapping"),
    ],
)
def test_a_bad_bandwidth_is_refused_naming_the_key(text: str, what: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_cluster(f"name: x\nlayout: {{nodes_per_rack: 2}}\n{text}\n", "c.yaml")
    assert what in str(caught.value)


def test_bandwidths_default_to_the_documented_ones_and_span_by_the_slowest_link() -> None:
    cluster = parse_cluster("name: x\nlayout: {nodes_per_rack: 2}\nbandwidth: {node: 20}\n")
    bandwidth = cluster.bandwidth
    assert [bandwidth.at(level) for level in DomainLevel] == [300.0, 20.0, 25.0, 12.5, 6.25]
    assert bandwidth.spanning(DomainLevel.RACK) == 20.0  # the rack is reached over PCIe
