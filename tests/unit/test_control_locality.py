"""Data locality, live side: a node's cache writes its inventory; the control loop's reader
takes an inventory into the scheduler state only when its file changed."""

from __future__ import annotations

import os
from pathlib import Path

from aicluster.artifacts.datasets import DatasetFiles
from aicluster.artifacts.storage import LocalStorage
from aicluster.control.loop.locality import CacheReports
from aicluster.runtime.gang.datacache import NodeDataCache
from aicluster.runtime.workdir import node_cache
from aicluster.scheduler import SchedulerConfig, make_state
from builders import small_cluster


def _cache(state_dir: Path, node: str) -> NodeDataCache:
    files = DatasetFiles(LocalStorage(state_dir / "store"), state_dir / "tmp")
    return NodeDataCache(node_cache(state_dir, node) / "data", files, 1 << 30)


def _hold(cache: NodeDataCache, tenant: str, sha: str) -> None:
    path = cache.root / "shards" / tenant / sha
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * 10)


def test_nodes_report_and_the_loop_reads_only_what_changed(tmp_path: Path) -> None:
    state = make_state(
        small_cluster(nodes=2), {}, SchedulerConfig(placement_preferences=("data_cached_bytes",))
    )
    cache = _cache(tmp_path, "node-1")
    _hold(cache, "alpha", "a" * 64)
    cache.report()
    reports = CacheReports()
    reports.sync(state, str(tmp_path), ["node-0", "node-1"])  # node-0 never reported
    assert state.index.node_shards == {1: frozenset({f"alpha/{'a' * 64}"})}
    state.set_node_shards("node-1", [])  # (so that a re-read would show)
    reports.sync(state, str(tmp_path), ["node-0", "node-1"])
    assert state.index.node_shards == {}  # unchanged file: not read again
    (cache.root / "shards" / "alpha" / ("a" * 64)).unlink()  # evicted
    _hold(cache, "beta", "b" * 64)
    cache.report()
    inventory = cache.root / "inventory.json"
    os.utime(inventory, ns=(1, 1))  # a new stamp even on a coarse clock
    reports.sync(state, str(tmp_path), ["node-1"])
    assert state.index.node_shards == {1: frozenset({f"beta/{'b' * 64}"})}


def test_nothing_is_read_with_the_term_off(tmp_path: Path) -> None:
    state = make_state(small_cluster(nodes=2), {}, SchedulerConfig())
    cache = _cache(tmp_path, "node-1")
    _hold(cache, "alpha", "a" * 64)
    cache.report()
    reports = CacheReports()
    reports.sync(state, str(tmp_path), ["node-1"])
    assert state.index.node_shards == {} and reports.seen == {}
