"""The simulator's data model: per-node dataset caches and the time a job waits for its data.

A trace job may read one dataset (``dataset``, ``data_gb``: :mod:`aicluster.sim.traces`). Each
node keeps a byte-bounded LRU cache of datasets, like the real node cache
(:mod:`aicluster.runtime.gang.datacache`, bounded by ``simulation.data_cache_gb``). When a job
starts, each of its nodes that lacks the dataset fetches all of it, from the nearest place that
holds it: another node of its rack (over the rack's link), of its pod (the pod's), else the store,
reached over the cluster's link. The job waits for its slowest node: ``bytes missing ÷
bandwidth`` of that link (the cluster file's ``bandwidth:`` section, GB/s). Then every node of
the job caches the dataset, and the scheduler hears of it (``SchedulerState.set_node_shards``:
what the locality term reads), as live nodes report their caches.
"""

from __future__ import annotations

from collections import OrderedDict

from aicluster.core import Cluster, DomainLevel, Placement
from aicluster.scheduler import SchedulerState

__all__ = ["DataModel"]

_GB = 1e9


class DataModel:
    """Per-node dataset caches of ``cache_bytes`` each on ``cluster``, reported to ``state``."""

    def __init__(self, cluster: Cluster, state: SchedulerState, cache_bytes: int) -> None:
        self.state, self.cache_bytes = state, cache_bytes
        self.rack = {node.name: node.rack for node in cluster.nodes}
        self.pod = {node.name: node.pod for node in cluster.nodes}
        bandwidth = cluster.bandwidth
        self.gbps = {level: bandwidth.at(level) for level in DomainLevel}
        #: node -> dataset -> bytes, least recently used first.
        self.caches: dict[str, OrderedDict[str, int]] = {}
        #: where each dataset is cached: dataset -> nodes.
        self.holders: dict[str, set[str]] = {}
        self.bytes_moved = 0
        self.wait_seconds = 0.0  # summed over jobs (each job: its slowest node's fetch)

    def start(self, placement: Placement, dataset: str, size: int) -> float:
        """A job reading ``dataset`` (``size`` bytes) starts on ``placement``: the seconds it
        waits for the data; the nodes cache it from now on."""
        wait = 0.0
        for node in placement.nodes:
            cache = self.caches.setdefault(node, OrderedDict())
            if dataset in cache:
                cache.move_to_end(dataset)
                continue
            wait = max(wait, size / (self.gbps[self._source(node, dataset)] * _GB))
            self.bytes_moved += size
            self._keep(node, cache, dataset, size)
        self.wait_seconds += wait
        return wait

    def _source(self, node: str, dataset: str) -> DomainLevel:
        """The link a fetch crosses: from a node of the rack, of the pod, else the store."""
        holders = self.holders.get(dataset, ())
        if any(self.rack[other] == self.rack[node] for other in holders):
            return DomainLevel.RACK
        if any(self.pod[other] == self.pod[node] for other in holders):
            return DomainLevel.POD
        return DomainLevel.CLUSTER

    def _keep(self, node: str, cache: OrderedDict[str, int], dataset: str, size: int) -> None:
        if size > self.cache_bytes:
            return  # larger than the cache: read through, never kept
        cache[dataset] = size
        total = sum(cache.values())
        while total > self.cache_bytes:
            evicted, freed = cache.popitem(last=False)
            self.holders[evicted].discard(node)
            total -= freed
        self.holders.setdefault(dataset, set()).add(node)
        self.state.set_node_shards(node, cache.keys())
