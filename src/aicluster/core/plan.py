"""A scheduling Plan: what the scheduler decided, each decision with its reason.

The scheduler only returns plans; a control loop (live or simulated) applies them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from aicluster.core.init_args import rebuilt_by_init
from aicluster.core.topology import DomainLevel

__all__ = [
    "Admit",
    "PendingCode",
    "PendingReason",
    "Placement",
    "Plan",
    "Preempt",
    "Slot",
    "VictimKind",
]


# Slot, Placement and Admit write their __init__ out (init=False) rather than let dataclasses
# generate it: mypyc compiles a class's own __init__ (each object.__setattr__ of a frozen class
# to a store, about thirty times faster, measured) but leaves the generated one interpreted, and
# the simulator makes one of each per job it starts.


@dataclass(frozen=True, slots=True, init=False)
class Slot:
    """GPUs taken on one node (and one NVLink domain of it) by one placement unit, with the
    unit's CPUs and memory (GB) on that node."""

    node: str
    gpus: int
    nvlink_domain: int
    cpus: float
    memory_gb: float

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    def __init__(
        self,
        node: str,
        gpus: int,
        nvlink_domain: int = 0,
        cpus: float = 0.0,
        memory_gb: float = 0.0,
    ) -> None:
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "gpus", gpus)
        object.__setattr__(self, "nvlink_domain", nvlink_domain)
        object.__setattr__(self, "cpus", cpus)
        object.__setattr__(self, "memory_gb", memory_gb)


@dataclass(frozen=True, slots=True, init=False)
class Placement:
    """Where a gang goes: one slot per placement unit, in rank order, and why there (``score``:
    none given, an empty one)."""

    slots: tuple[Slot, ...]
    level: DomainLevel
    domain: str
    score: Mapping[str, float]

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    def __init__(
        self,
        slots: tuple[Slot, ...],
        level: DomainLevel,
        domain: str,
        score: Mapping[str, float] | None = None,
    ) -> None:
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "domain", domain)
        object.__setattr__(self, "score", {} if score is None else score)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Distinct nodes, in rank order."""
        return tuple(dict.fromkeys(slot.node for slot in self.slots))

    def gpus_by_node(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for slot in self.slots:
            totals[slot.node] = totals.get(slot.node, 0) + slot.gpus
        return totals

    def explain(self) -> str:
        parts = ", ".join(f"{key}={value:g}" for key, value in self.score.items())
        return f"{self.level.label} {self.domain} on {len(self.nodes)} node(s) ({parts})"


@dataclass(frozen=True, slots=True, init=False)
class Admit:
    """Start ``job_id`` now, on ``placement``; ``borrowed`` GPUs come from others' idle quota;
    ``workers``: fewer than the job asks for, an elastic job started smaller (None: all)."""

    job_id: str
    placement: Placement
    reason: str
    borrowed: int
    backfilled: bool
    workers: int | None

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return rebuilt_by_init(self)  # (see core/init_args.py)

    def __init__(
        self,
        job_id: str,
        placement: Placement,
        reason: str,
        borrowed: int = 0,
        backfilled: bool = False,
        workers: int | None = None,
    ) -> None:
        object.__setattr__(self, "job_id", job_id)
        object.__setattr__(self, "placement", placement)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "borrowed", borrowed)
        object.__setattr__(self, "backfilled", backfilled)
        object.__setattr__(self, "workers", workers)


class VictimKind(StrEnum):
    """The right by which a job preempts another, in the order victims are freed."""

    RECLAIM = "reclaim"  # an in-quota tenant takes back GPUs others borrowed from it
    PRIORITY = "priority"  # a job preempts lower-priority jobs (by the priority gap)
    POLICY = "policy"  # the queue policy's own right (SRTF, Tiresias demotion)

    @property
    def rank(self) -> int:
        """Reclaim victims are freed first, then priority's, then the policy's."""
        return _VICTIM_ORDER[self]


_VICTIM_ORDER = {VictimKind.RECLAIM: 0, VictimKind.PRIORITY: 1, VictimKind.POLICY: 2}


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop ``job_id`` (checkpoint first when it can) and put it back in the queue."""

    job_id: str
    reason: str
    kind: VictimKind
    for_job: str | None = None


class PendingCode(StrEnum):
    OVER_QUOTA = "over-quota"
    BORROW_LIMIT = "borrow-limit"
    NO_CAPACITY = "no-capacity"
    TOPOLOGY = "topology"
    RESERVATION = "blocked-by-reservation"
    QUEUE_ORDER = "queue-order"
    POWER_CAP = "power-cap"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: PendingCode
    message: str
    blocking_job: str | None = None

    def __str__(self) -> str:
        return self.message


@dataclass(slots=True)
class Plan:
    """The outcome of one scheduling cycle.

    ``preemptions`` are applied before ``admissions`` (admissions may use the GPUs they free).
    ``pending`` gives every job left waiting a reason. ``next_wakeup`` is the earliest time at which
    the decision could change without any new event (for example a running job crossing a
    Tiresias queue threshold); ``None`` when only events can change it.
    """

    admissions: list[Admit] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    pending: dict[str, PendingReason] = field(default_factory=dict)
    next_wakeup: float | None = None
    examined: int = 0
    default_reason: PendingReason | None = None
    #: When the first protection that held a waiting job's victim back lapses
    #: (``scheduler.protection``); None when none did. Included in ``next_wakeup``.
    protected_until: float | None = None
    #: The index already holds the admissions' GPUs (``schedule(..., hold=True)``): the caller
    #: starts them without allocating again.
    held: bool = False
    _admitted: frozenset[str] | None = field(default=None, repr=False, compare=False)

    def reason_for(self, job_id: str) -> PendingReason | None:
        """Why ``job_id`` still waits after this cycle (None if it was admitted)."""
        if job_id in self._admitted_ids():
            return None
        return self.pending.get(job_id, self.default_reason)

    def _admitted_ids(self) -> frozenset[str]:
        # Cached (a queue view asks for thousands of jobs), rebuilt if admissions grew since.
        if self._admitted is None or len(self._admitted) != len(self.admissions):
            self._admitted = frozenset(admit.job_id for admit in self.admissions)
        return self._admitted

    @property
    def empty(self) -> bool:
        return not self.admissions and not self.preemptions
