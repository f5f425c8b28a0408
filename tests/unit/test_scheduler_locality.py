"""Data locality as a placement term: among placements the search finds otherwise equal, the
one whose nodes cache more of the job's input bytes wins; the score and ``why`` show it."""

from __future__ import annotations

import pytest

from aicluster.configuration import parse_configuration, scheduler_config
from aicluster.core import ConfigError, Job, Plan
from aicluster.scheduler import SchedulerConfig, make_state, schedule
from builders import small_cluster

LOCALITY = SchedulerConfig(placement_preferences=("data_cached_bytes",))
GiB = 1 << 30
DATA = (("t/aa", 3 * GiB), ("t/bb", 1 * GiB))


def plan_for(
    job: Job, config: SchedulerConfig, cached: dict[str, list[str]], *, nodes: int = 4
) -> Plan:
    state = make_state(small_cluster(nodes=nodes, per_rack=2), {}, config)
    for node, shards in cached.items():
        state.set_node_shards(node, shards)
    state.submit(job, 0.0)
    return schedule(state.snapshot(0.0))


def test_a_one_node_job_goes_where_its_data_is_cached() -> None:
    job = Job("j", "t", gpus_per_worker=8, data=DATA)
    cached = {"node-2": ["t/bb"], "node-3": ["t/aa"]}
    (admit,) = plan_for(job, LOCALITY, cached).admissions
    assert admit.placement.nodes == ("node-3",)  # 3 GiB cached beats 1 GiB
    assert admit.placement.score["data_cached_bytes"] == 3 * GiB
    assert "data_cached_bytes=3.22123e+09" in admit.reason
    # the term off: the plain best fit, the first node, and no data term in the score
    (plain,) = plan_for(job, SchedulerConfig(), cached).admissions
    assert plain.placement.nodes == ("node-0",)
    assert "data_cached_bytes" not in plain.placement.score


def test_a_gang_prefers_the_rack_and_nodes_holding_its_data() -> None:
    job = Job("j", "t", workers=2, gpus_per_worker=8, data=DATA)
    (admit,) = plan_for(job, LOCALITY, {"node-3": ["t/aa", "t/bb"]}).admissions
    assert set(admit.placement.nodes) == {"node-2", "node-3"}  # rack-1, not rack-0
    assert admit.placement.score["data_cached_bytes"] == 4 * GiB
    # within one domain: of three equally free nodes, the two caching data
    job = Job("k", "t", workers=2, gpus_per_worker=8, data=DATA)
    cluster_cached = {"node-1": ["t/bb"], "node-2": ["t/aa"]}
    state = make_state(small_cluster(nodes=3, per_rack=3), {}, LOCALITY)
    for node, shards in cluster_cached.items():
        state.set_node_shards(node, shards)
    state.submit(job, 0.0)
    (admit,) = schedule(state.snapshot(0.0)).admissions
    assert set(admit.placement.nodes) == {"node-1", "node-2"}


def test_a_job_without_gpus_goes_where_its_data_is_cached() -> None:
    """A CPU-only job (say, data preparation) ranks its equal nodes by cached bytes too: on one
    node, and spread over a rack's nodes."""
    job = Job("cpu", "t", gpus_per_worker=0, cpus_per_worker=4, data=DATA)
    cached = {"node-1": ["t/bb"], "node-2": ["t/aa"]}
    (admit,) = plan_for(job, LOCALITY, cached).admissions
    assert admit.placement.nodes == ("node-2",)
    assert admit.placement.score["data_cached_bytes"] == 3 * GiB
    (plain,) = plan_for(job, SchedulerConfig(), cached).admissions
    assert plain.placement.nodes == ("node-0",)
    # two workers that no one node holds (each takes a node's CPUs): the rack caching more
    wide = Job("wide", "t", workers=2, gpus_per_worker=0, cpus_per_worker=64, data=DATA)
    (spread,) = plan_for(wide, LOCALITY, {"node-3": ["t/aa"]}).admissions
    assert set(spread.placement.nodes) == {"node-2", "node-3"}
    (plain,) = plan_for(wide, SchedulerConfig(), {"node-3": ["t/aa"]}).admissions
    assert set(plain.placement.nodes) == {"node-0", "node-1"}


def test_locality_never_beats_a_tighter_fit() -> None:
    """Data breaks ties only: a node with room left over loses to the best fit, cache or not."""
    state = make_state(small_cluster(nodes=2, per_rack=2), {}, LOCALITY)
    state.submit(Job("six", "t", gpus_per_worker=6), 0.0)
    six = schedule(state.snapshot(0.0)).admissions[0]
    state.start("six", six.placement, 0.0)
    other = "node-1" if six.placement.nodes == ("node-0",) else "node-0"
    state.set_node_shards(other, ["t/aa", "t/bb"])
    state.submit(Job("two", "t", gpus_per_worker=2, data=DATA), 1.0)
    (admit,) = schedule(state.snapshot(1.0)).admissions
    assert admit.placement.nodes == six.placement.nodes  # the 2 GPUs left there


def test_a_node_reports_its_cache_incrementally() -> None:
    state = make_state(small_cluster(nodes=2), {}, LOCALITY)
    state.set_node_shards("node-1", ["t/aa"])
    state.set_node_shards("no-such-node", ["t/aa"])  # ignored
    assert state.index.node_shards == {1: frozenset({"t/aa"})}
    state.set_node_shards("node-1", [])  # evicted all
    assert state.index.node_shards == {}


def test_the_configuration_lists_terms_in_order() -> None:
    text = "placement:\n  preferences: [level, free_left_on_nodes, nodes, data_cached_bytes]\n"
    config = scheduler_config(parse_configuration(text)[0])
    assert config.placement_preferences == ("data_cached_bytes",)
    short = parse_configuration("placement:\n  preferences: [data_cached_bytes]\n")[0]
    assert scheduler_config(short).placement_preferences == ("data_cached_bytes",)
    default = parse_configuration("backfill: easy\n")[0]
    assert scheduler_config(default).placement_preferences == ()
    with pytest.raises(ConfigError, match="built-in terms come first"):
        parse_configuration("placement:\n  preferences: [data_cached_bytes, level]\n")
    with pytest.raises(ConfigError, match=r":2: placement\.preferences\.0: Input should be"):
        parse_configuration("placement:\n  preferences: [nearest_coffee]\n")
