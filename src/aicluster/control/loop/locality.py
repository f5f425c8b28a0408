"""Data locality, live: what the nodes' caches hold into the scheduler state, and each job's
input shards onto the scheduler's view of the job (:mod:`aicluster.scheduler.locality`).

A node reports its cache by rewriting its inventory after it prepares a job's data
(:meth:`aicluster.runtime.gang.datacache.NodeDataCache.report`, in the state directory the nodes and
the server share, as they share run directories). :class:`CacheReports` reads an inventory only
when its file changed since the last tick (one ``stat`` a node a tick, and only while the
locality term is on), so the state is kept incrementally. A job's shards come from the
manifests of the dataset versions resolved at submit (immutable: one read when it is queued).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import replace

from aicluster.core import Job, names
from aicluster.runtime.gang.datacache import read_inventory
from aicluster.runtime.workdir import node_cache
from aicluster.scheduler import SchedulerState
from aicluster.store import JobRecord, NotFound, Store

__all__ = ["CacheReports", "with_input_shards"]

log = logging.getLogger(__name__)


class CacheReports:
    """The nodes' cache inventories last read (by the file's mtime and size)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[int, int]] = {}

    def reset(self) -> None:
        """A fresh state knows nothing yet: read every inventory again."""
        self.seen.clear()

    def sync(self, state: SchedulerState, state_dir: str, nodes: Iterable[str]) -> None:
        if not state.index.locality:
            return
        for node in nodes:
            path = node_cache(state_dir, node) / "data" / "inventory.json"
            try:
                found = os.stat(path)
            except FileNotFoundError:
                continue
            stamp = (found.st_mtime_ns, found.st_size)
            if self.seen.get(node) == stamp:
                continue
            self.seen[node] = stamp
            state.set_node_shards(node, read_inventory(path))


def with_input_shards(store: Store, record: JobRecord, job: Job) -> Job:
    """``job`` with the shards of the dataset versions its spec names (``tenant/sha256`` and
    bytes, each once), for the locality term; unchanged for a job without data."""
    if not record.spec.data:
        return job
    shards: dict[str, int] = {}
    tenant = names.part(record.tenant)  # as the node cache names the tenant's folder
    for name, version in record.spec.data_refs():
        try:
            found = store.get_dataset_version(record.tenant, name, version)
        except NotFound:  # deleted since submit: the job fails when it prepares its data
            log.info("job %s: dataset %s:%s is gone", record.id, name, version)
            continue
        for shard in found.manifest.get("shards", []):
            shards[f"{tenant}/{shard['sha256']}"] = int(shard["size"])
    return replace(job, data=tuple(sorted(shards.items())))
