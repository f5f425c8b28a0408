"""The simulator's data model: trace columns, per-node LRU caches of datasets, the wait for
the bytes a job's nodes lack (by link level), bytes moved, and the locality term in a replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from aicluster.core import make_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, TraceJob, simulate, summarize
from aicluster.sim.traces import TraceError, load_csv

QUIET = SimConfig(failures=False, checkpoint_interval=None, data_cache_bytes=int(100e9))
LOCALITY = SchedulerConfig(placement_preferences=("data_cached_bytes",))
GB = 1e9


def replay(scheduler: SchedulerConfig, cluster_nodes: int = 2) -> dict[str, object]:
    """``other`` (no data) takes node-0 and ``first`` node-1, which then caches D (50 GB);
    ``again`` reads D later, when both nodes are free."""
    jobs = [
        TraceJob("other", 0.0, 100.0, 8),
        TraceJob("first", 0.0, 100.0, 8, dataset="D", data_gb=50.0),
        TraceJob("again", 1000.0, 100.0, 8, dataset="D", data_gb=50.0),
    ]
    cluster = make_cluster(nodes=cluster_nodes, gpus_per_node=8, nodes_per_rack=2)
    result = simulate(cluster, jobs, "fifo", scheduler=scheduler, config=QUIET)
    ends = dict(zip(result.jobs.ids, result.jobs.end, strict=True))
    return {"ends": ends, "summary": summarize(result)}


def test_a_job_waits_for_the_bytes_its_nodes_lack_and_locality_saves_it() -> None:
    store = 50 * GB / (6.25 * GB)  # the first fetch: from the store, over the cluster's link
    from_rack = 50 * GB / (25.0 * GB)  # later: from the rack's node that holds it
    plain = replay(SchedulerConfig())
    assert plain["ends"]["first"] == pytest.approx(100.0 + store)
    assert plain["ends"]["again"] == pytest.approx(1000.0 + from_rack + 100.0)  # on node-0
    assert plain["summary"]["data_gb_moved"] == pytest.approx(100.0)
    local = replay(LOCALITY)
    assert local["ends"]["again"] == pytest.approx(1100.0)  # node-1 had it: no wait
    assert local["summary"]["data_gb_moved"] == pytest.approx(50.0)
    assert local["summary"]["data_wait_hours"] == pytest.approx(store / 3600)


def test_the_cache_is_a_bounded_lru() -> None:
    jobs = [
        TraceJob("a", 0.0, 10.0, 8, dataset="A", data_gb=30.0),
        TraceJob("b", 100.0, 10.0, 8, dataset="B", data_gb=30.0),  # evicts A (cache 40 GB)
        TraceJob("c", 200.0, 10.0, 8, dataset="A", data_gb=30.0),
    ]
    cluster = make_cluster(nodes=1, gpus_per_node=8)
    config = SimConfig(failures=False, checkpoint_interval=None, data_cache_bytes=int(40 * GB))
    summary = summarize(simulate(cluster, jobs, "fifo", scheduler=LOCALITY, config=config))
    assert summary["data_gb_moved"] == pytest.approx(90.0)


def test_a_replay_without_data_reports_no_data_figures() -> None:
    cluster = make_cluster(nodes=1, gpus_per_node=8)
    summary = summarize(simulate(cluster, [TraceJob("x", 0.0, 10.0, 8)], "fifo", config=QUIET))
    assert "data_gb_moved" not in summary


def test_the_generic_csv_carries_dataset_and_size(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("submit_time,duration,num_gpus,dataset,data_gb\n0,10,8,imagenet,150\n1,5,1,,\n")
    first, second = load_csv(path)
    assert (first.dataset, first.data_gb) == ("imagenet", 150.0)
    assert (second.dataset, second.data_gb) == ("", 0.0)
    path.write_text("submit_time,duration,num_gpus,data_gb\n0,10,8,150\n")
    with pytest.raises(TraceError, match=r"t\.csv:2: data_gb needs a dataset"):
        load_csv(path)
