"""The capacity planner's pure parts: SLO and grid parsing, the search (a fake replay at that
one boundary) and growing a cluster from its template."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aicluster.core import parse_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig
from aicluster.sim.plan import PlanSetup, _search_variant, meets, scale_cluster, search
from aicluster.sim.plan_report import answer_line
from aicluster.sim.plan_spec import Grid, PlanError, parse_slo, parse_vary
from aicluster.sim.twin import cluster_file_text

TEMPLATE = """
name: t
defaults: {gpus: 8, gpu_type: V100, nvlink_domain_size: 8}
layout: {pods: 1, racks_per_pod: 2, nodes_per_rack: 4}
power: {V100: {idle_watts: 50, busy_watts: 300}}
power_budget_w: 100000
racks: {rack-1: {power_budget_w: 20000}}
"""


def test_slos_name_summary_keys_in_its_units() -> None:
    wait = parse_slo("p95_wait<=1h")
    assert (wait.key, wait.op, wait.bound, wait.helped_by_size) == (
        "queue_delay_p95",
        "<=",
        3600,
        True,
    )
    assert parse_slo("jct_p90 < 2d").key == "jct_p90"
    assert parse_slo("p50_jct<=30m").key == "jct_median" and parse_slo("p50_jct<=30m").bound == 1800
    assert parse_slo("mean_slowdown<=2x").key == "slowdown_mean"
    util = parse_slo("utilization>=70%")
    assert (util.key, util.bound, util.helped_by_size) == ("utilization", 0.7, False)
    energy = parse_slo("energy<=2MWh")
    assert (energy.key, energy.bound, energy.helped_by_size) == ("energy_kwh", 2000, False)
    assert parse_slo("p95_wait<=1h").met(3599) and not parse_slo("p95_wait<=1h").met(math.nan)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("p95_foo<=1h", "unknown metric 'p95_foo'"),
        ("p100_wait<=1h", "unknown metric"),
        ("p95_wait=1h", "expected METRIC OP BOUND"),
        ("p95_wait<=1kg", "unit 'kg' does not fit"),
        ("utilization>=5h", "unit 'h' does not fit"),
        ("p95_wait<=1..2h", "is not a number"),
    ],
)
def test_a_bad_slo_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(PlanError, match=says):
        parse_slo(text)


def test_the_grid_steps_by_one_unless_told() -> None:
    assert parse_vary(["nodes=8..12"]).nodes == (8, 9, 10, 11, 12)
    grid = parse_vary(["nodes=8..128:40", "gpu_type=A100,H100", "racks=2,4"])
    assert grid.nodes == (8, 48, 88, 128)
    assert grid.variants() == [("A100", 2), ("A100", 4), ("H100", 2), ("H100", 4)]
    assert parse_vary(["racks=2..4", "nodes=3,1"]) == Grid((1, 3), (None,), (2, 3, 4))


@pytest.mark.parametrize(
    ("texts", "says"),
    [
        (["racks=2"], "nodes=LOW..HIGH"),
        (["nodes=9..8"], "1 <= LOW <= HIGH"),
        (["nodes=0..8"], "1 <= LOW <= HIGH"),
        (["nodes=8..9:0"], "1 <= LOW <= HIGH"),
        (["nodes=a..b"], "expected LOW..HIGH"),
        (["nodes"], "expected NAME=VALUES"),
        (["nodes=1..2", "zones=3"], "unknown dimension 'zones'"),
        (["nodes=1..2", "nodes=3..4"], "given twice"),
        (["nodes=1..2", "gpu_type=A100,"], "expected names"),
    ],
)
def test_a_bad_vary_says_what_is_wrong(texts: list[str], says: str) -> None:
    with pytest.raises(PlanError, match=says):
        parse_vary(texts)


def _fake(threshold: int, calls: list[list[int]]):  # type: ignore[no-untyped-def]
    """A replay whose p95 wait falls below an hour from ``threshold`` nodes on."""

    def evaluate(batch: list[int]) -> dict[int, dict[str, float]]:
        calls.append(batch)
        return {n: {"queue_delay_p95": 1800.0 if n >= threshold else 7200.0} for n in batch}

    return evaluate


@given(
    low=st.integers(1, 20),
    count=st.integers(1, 60),
    threshold=st.integers(0, 90),
    width=st.integers(1, 6),
)
def test_the_search_finds_the_smallest_size_and_replays_the_one_below(
    low: int, count: int, threshold: int, width: int
) -> None:
    sizes = list(range(low, low + count))
    calls: list[list[int]] = []
    tried, answer, below = search(
        sizes, [parse_slo("p95_wait<=1h")], _fake(threshold, calls), width
    )
    meeting = [n for n in sizes if n >= threshold]
    assert answer == (meeting[0] if meeting else None)
    if answer is not None and answer > sizes[0]:
        assert below == answer - 1 and below in tried
    assert all(len(batch) <= width for batch in calls)
    # Searching, not sweeping: about log(count) / log(width + 1) rounds.
    assert len(calls) <= math.ceil(math.log(count + 1, width + 1)) + 2


def test_a_binary_search_replays_a_handful_of_a_hundred_sizes() -> None:
    calls: list[list[int]] = []
    _, answer, below = search(list(range(8, 129)), [parse_slo("p95_wait<=1h")], _fake(77, calls), 1)
    assert (answer, below) == (77, 76)
    assert sum(map(len, calls)) <= 9


def test_an_slo_that_size_hurts_is_checked_at_the_answer() -> None:
    slos = [parse_slo("p95_wait<=1h"), parse_slo("utilization>=50%")]

    def evaluate(batch: list[int]) -> dict[int, dict[str, float]]:
        return {
            n: {"queue_delay_p95": 7200.0 if n < 10 else 60.0, "utilization": 4 / n} for n in batch
        }

    tried, answer, _ = search(list(range(1, 21)), slos, evaluate, 2)
    assert answer == 10 and not slos[1].met(tried[10]["utilization"])


def test_a_cluster_grows_from_its_template_rack_by_rack() -> None:
    template = parse_cluster(TEMPLATE)
    grown = scale_cluster(template, 11)
    assert len(grown.nodes) == 11 and grown.total_gpus == 88
    assert [len(nodes) for nodes in grown.racks().values()] == [4, 4, 3]
    assert sorted(grown.pods()) == ["pod-0", "pod-1"]
    assert [b.name for b in grown.budgets] == ["cluster", "rack rack-1"]
    assert [b.name for b in scale_cluster(template, 4).budgets] == ["cluster"]  # no rack-1
    varied = scale_cluster(template, 10, gpu_type="H100", racks=5)
    assert {n.gpu_type for n in varied.nodes} == {"H100"} and len(varied.racks()) == 5
    with pytest.raises(ValueError, match="at least one node"):
        scale_cluster(template, 0)


def test_a_grown_cluster_written_as_a_file_reads_back_the_same() -> None:
    grown = scale_cluster(parse_cluster(TEMPLATE), 9, gpu_type="H100")
    again = parse_cluster(cluster_file_text(grown))
    assert again.nodes == grown.nodes and again.budgets == grown.budgets
    assert again.power == grown.power and again.bandwidth == grown.bandwidth


def test_an_answer_that_misses_an_slo_size_hurts_is_no_answer() -> None:
    template = parse_cluster(TEMPLATE)
    setup = PlanSetup(
        template,
        [],
        SchedulerConfig(),
        SimConfig(),
        [parse_slo("p95_wait<=1h"), parse_slo("utilization>=50%")],
    )

    def evaluate(batch: list[int]) -> dict[int, dict[str, float]]:
        return {
            n: {"queue_delay_p95": 60.0 if n >= 6 else 7200.0, "utilization": 2 / n} for n in batch
        }

    variant = _search_variant(setup, range(1, 17), (None, None), evaluate, 3)
    assert variant.answer is None and variant.trials[6].met == (True, False)
    assert "6 nodes meet the rest but miss utilization>=50%" in variant.note
    assert answer_line(variant).startswith("smallest: none: 6 nodes")


def test_a_replay_that_leaves_jobs_unfinished_meets_no_slo() -> None:
    slo = parse_slo("p95_wait<=1h")
    assert meets(slo, {"queue_delay_p95": 60.0, "unfinished": 0})
    assert not meets(slo, {"queue_delay_p95": 60.0, "unfinished": 3})
