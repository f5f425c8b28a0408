"""Data locality: which nodes already hold a job's input shards, as a placement preference.

Nodes report the shards their cache holds (:meth:`aicluster.scheduler.state.SchedulerState.
set_node_shards`); a job names its input shards and their bytes (:attr:`aicluster.core.Job.
data`). With the ``data_cached_bytes`` term on (``placement.preferences`` in the configuration
file), among placements the search otherwise finds equal (the same level, the same best fit of
the domain and of each node), the one whose nodes hold the most of the job's bytes wins.

Everything here runs only for a job with data while the term is on (:func:`applies`): a job
without data, or any job with the term off, does no per-node work and decides as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from aicluster.core import Job
from aicluster.scheduler.index import FreeIndex

__all__ = [
    "BUILT_IN_TERMS",
    "DATA_CACHED_BYTES",
    "PREFERENCE_TERMS",
    "applies",
    "cached_bytes",
    "on_nodes",
]

#: The term's name in the configuration, the placement score and ``why``.
DATA_CACHED_BYTES = "data_cached_bytes"
#: The placement terms the search ranks by, in this order, whatever the configuration says.
BUILT_IN_TERMS = ("level", "free_left_on_nodes", "nodes")
#: The optional placement terms the configuration may list, after the built-in ones.
PREFERENCE_TERMS = (DATA_CACHED_BYTES,)


def applies(index: FreeIndex, job: Job) -> bool:
    """Whether the locality term decides anything for ``job``."""
    return index.locality and bool(job.data) and bool(index.node_shards)


def cached_bytes(index: FreeIndex, job: Job, node: int) -> int:
    """The bytes of ``job``'s input shards that ``node``'s cache holds."""
    held = index.node_shards.get(node)
    if not held:
        return 0
    return sum(size for key, size in job.data if key in held)


def on_nodes(index: FreeIndex, job: Job, nodes: Iterable[int]) -> int:
    """The job's bytes already cached on ``nodes``, each node counted once."""
    return sum(cached_bytes(index, job, node) for node in set(nodes))
