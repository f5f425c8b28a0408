"""Pure scheduling decisions: a snapshot of the cluster and queue in, a Plan out.

``SchedulerState`` is the incrementally maintained world a control loop owns; ``schedule`` reads
it through a ``Snapshot`` and never changes it; policies are registered by name.
"""

from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.cycle import schedule
from aicluster.scheduler.entries import PendingEntry, Progress, RunningEntry
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.placement import PlacementFailure, find_placement
from aicluster.scheduler.policies import make_policy, make_state, names
from aicluster.scheduler.state import SchedulerState, Snapshot

__all__ = [
    "FreeIndex",
    "PendingEntry",
    "PlacementFailure",
    "Progress",
    "RunningEntry",
    "SchedulerConfig",
    "SchedulerState",
    "Snapshot",
    "find_placement",
    "make_policy",
    "make_state",
    "names",
    "schedule",
]
