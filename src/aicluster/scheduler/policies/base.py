"""The queue-order extension point: one small protocol, policies registered by name.

Like the Kubernetes scheduler framework's QueueSort plugin, a policy decides the order in which
pending jobs are considered; like its PostFilter (preemption), it may name running jobs a waiting
job is entitled to displace. Everything else (admission, placement, backfill) is shared.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from aicluster.core.init_args import rebuilt_by_init
from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.entries import Lane, PendingEntry, RunningEntry
from aicluster.scheduler.state import Snapshot

__all__ = ["Candidate", "LaneMerge", "Ordering", "QueuePolicy", "register", "registry"]

LaneItems = Sequence[tuple[tuple[float, ...], int, str]]


@dataclass(slots=True, init=False)
class Candidate:
    """The next pending job a cycle considers, and where it sits in its lane."""

    job_id: str
    lane: int
    position: int

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    # Written out (init=False): mypyc compiles it, not dataclasses' (one per job a cycle).
    def __init__(self, job_id: str, lane: int, position: int) -> None:
        self.job_id, self.lane, self.position = job_id, lane, position


class Ordering:
    """Yields pending jobs in policy order; a lane whose head failed can be dropped whole."""

    def pop(self) -> Candidate | None:
        raise NotImplementedError

    def finish(self, candidate: Candidate, *, placed: bool, drop_lane: bool) -> None:
        raise NotImplementedError

    def put_back(self, candidate: Candidate) -> None:
        """Return a popped candidate unexamined (the cycle stopped before it)."""
        raise NotImplementedError

    def remaining(self) -> list[tuple[LaneItems, int]]:
        """Lanes (with the position they stopped at) not yet exhausted: for explanations."""
        raise NotImplementedError

    def lane_items(self, candidate: Candidate) -> LaneItems:
        raise NotImplementedError


class LaneMerge(Ordering):
    """K-way merge of sorted lanes by key, without copying them (the state owns the lists)."""

    def __init__(self, lanes: Mapping[Lane, LaneItems]) -> None:
        self.lanes: list[LaneItems] = list(lanes.values())
        self.heap = [(items[0][0], items[0][1], i, 0) for i, items in enumerate(self.lanes)]
        heapq.heapify(self.heap)
        self.stopped: dict[int, int] = {}

    def pop(self) -> Candidate | None:
        if not self.heap:
            return None
        _, _, lane, position = heapq.heappop(self.heap)
        return Candidate(self.lanes[lane][position][2], lane, position)

    def finish(self, candidate: Candidate, *, placed: bool, drop_lane: bool) -> None:
        items, nxt = self.lanes[candidate.lane], candidate.position + 1
        if drop_lane:
            self.stopped[candidate.lane] = nxt
        elif nxt < len(items):
            heapq.heappush(self.heap, (items[nxt][0], items[nxt][1], candidate.lane, nxt))

    def put_back(self, candidate: Candidate) -> None:
        key, seq, _ = self.lanes[candidate.lane][candidate.position]
        heapq.heappush(self.heap, (key, seq, candidate.lane, candidate.position))

    def remaining(self) -> list[tuple[LaneItems, int]]:
        left = [(self.lanes[lane], position) for lane, position in self.stopped.items()]
        left += [(self.lanes[lane], position) for _, _, lane, position in self.heap]
        return left

    def lane_items(self, candidate: Candidate) -> LaneItems:
        return self.lanes[candidate.lane]

    @property
    def empty(self) -> bool:
        return not self.heap


class QueuePolicy:
    """Default behaviour shared by all policies; subclasses override what they change.

    Every method states a decision plainly, for one job at a time, and reads without changing
    anything. Faster forms of the same answers (in bulk, or skipping work that cannot change the
    outcome) belong to the policy's shortcuts (:mod:`aicluster.scheduler.shortcuts`), never here.
    """

    name: ClassVar[str] = ""
    #: Whether the policy itself entitles waiting jobs to preempt running ones (SRTF, Tiresias).
    preemptive: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        """Sort key while pending (lower runs first); fixed until :meth:`rekey_at`."""
        raise NotImplementedError

    def group(self, entry: PendingEntry) -> Hashable:
        """Lanes are grouped by this (the fair policy groups by tenant)."""
        return ""

    def lane_class(self, entry: PendingEntry) -> Hashable:
        """Jobs of one shape and one lane class fail or succeed alike within a cycle."""
        return (entry.job.tenant, entry.job.priority)

    def rekey_at(self, entry: PendingEntry) -> float | None:
        """When the job's key changes while it waits (None: never)."""
        return None

    def restarts_service(self, entry: PendingEntry, now: float) -> bool:
        """Whether the job's attained service starts again from 0 as it is (re-)keyed at
        ``now`` (Tiresias' promotion). The state resets it; :meth:`key` only reads."""
        return False

    def may_preempt(self, entry: PendingEntry, victim: RunningEntry, now: float) -> bool:
        """Policy-driven preemption right (priority and reclaim rights are checked elsewhere)."""
        return False

    def victim_rank(self, victim: RunningEntry, now: float) -> tuple[float, ...]:
        """Lower ranks are preempted first: lowest priority, least work lost, newest."""
        return (victim.job.priority, victim.lost_work(now), -victim.started_at)

    def running_class(self, running: RunningEntry, now: float) -> int:
        """A running job's standing for policy preemption (Tiresias: its queue); higher classes
        are preempted first. Changes only at :meth:`next_running_wakeup`."""
        return 0

    def class_may_be_preempted(self, entry: PendingEntry, running_class: int) -> bool:
        """Whether any running job of ``running_class`` could be preempted by ``entry``."""
        return self.preemptive

    def next_running_wakeup(self, running: RunningEntry, after: float) -> float | None:
        """The first time later than ``after`` at which this running job's standing changes (a
        Tiresias demotion); None if it never does."""
        return None

    def ordering(self, snapshot: Snapshot) -> Ordering:
        return LaneMerge(snapshot.state.lanes)


registry: dict[str, Callable[[SchedulerConfig], QueuePolicy]] = {}


def register(cls: type[QueuePolicy]) -> type[QueuePolicy]:
    """Make a policy selectable by its ``name`` in the config. Called after the class, not as a
    decorator: mypyc compiles a decorated class as a plain Python one, and a plain class may
    not subclass a compiled one (see setup.py)."""
    registry[cls.name] = cls
    return cls
