"""Scheduler configuration: which policies, chosen by name, and their knobs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from aicluster.core.power import PowerPolicy
from aicluster.scheduler.rights import PreemptionRights

__all__ = ["DEFAULT_POLICY", "PLACEMENT_STRATEGIES", "SchedulerConfig"]

_BACKFILL = ("easy", "none")
#: ``topology``: pack a gang into the narrowest domain that holds it; ``random``: a
#: topology-oblivious baseline (:mod:`aicluster.scheduler.placement.random`).
PLACEMENT_STRATEGIES = ("topology", "random")

#: The queue policy when nothing names one: live, in the simulator, in ``aicluster sim`` and in
#: the configuration file's schema (``docs/config.md``).
DEFAULT_POLICY = "fair"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Everything a scheduling cycle may depend on besides the snapshot.

    - ``queue``: queue-order policy name (``fifo``, ``priority``, ``sjf``, ``srtf``, ``tiresias``,
      ``fair``; see :func:`aicluster.scheduler.policies.names`).
    - ``backfill``: ``easy`` (a later job starts only if it cannot delay the blocked head's
      reservation) or ``none`` (strict order: nothing passes a blocked head).
    - ``preemption``: allow priority preemption (within a tenant, or of borrowed GPUs) and reclaim.
    - ``priority_gap``: by the priority right a job preempts only jobs at least this many
      priority levels below its own (1: any lower priority).
    - ``tiresias_thresholds``: attained GPU-seconds at which a job drops to the next queue.
    - ``tiresias_promote_knob``: a job waiting longer than knob × its last run is promoted
      to the top queue (starvation guard); 0 disables.
    - ``tiresias_promote_backoff``: that wait grows this many times with each requeue of the
      job past its first ``tiresias_promote_backoff_after`` (at least 1; 1: the paper's constant
      wait), so promotions settle (:mod:`.policies.tiresias`).
    - ``power``: power saving (:mod:`.power`): idle nodes are suspended, off nodes resumed when
      the queue needs them; None keeps every node on. (Power budgets are the cluster
      file's: :mod:`.budgets`.)
    - ``rights``: who may preempt whom, by which right (:mod:`.rights`; the defaults settle,
      :mod:`.preemption`).
    - ``min_runtime_s``: a run younger than this is not preempted by another tenant's job
      (reclaim, priority) nor by the policy's own right; its own tenant's priority still may
      (:mod:`.protection`). 0 turns it off.
    - ``cooldown_s``: a run of a job that has been preempted before is not preempted by any
      right, its own tenant's priority included, until it is this old. 0 turns it off.
    - ``max_victims``: how many preemption candidates the victim search examines per job.
    - ``explain``: give every pending job its own reason, a topology failure its largest domain
      (the simulator turns this off for speed).
    - ``shortcuts``: answer from the shortcut layer where it can (:mod:`.shortcuts`); off, every
      decision takes the plain path (the same decisions, more slowly).
    - ``placement``: ``topology`` (the narrowest domain that holds the gang) or ``random``
      (nodes in an order drawn from ``placement_seed`` and the job's id, under the same hard
      constraints: the baseline that shows what topology-aware placement buys).
    - ``placement_preferences``: optional placement terms that break ties among placements the
      search finds otherwise equal, in order (``data_cached_bytes``: :mod:`.locality`).
    """

    queue: str = DEFAULT_POLICY
    backfill: str = "easy"
    preemption: bool = True
    priority_gap: int = 1
    tiresias_thresholds: tuple[float, ...] = (3600.0, 36000.0)
    tiresias_promote_knob: float = 8.0
    tiresias_promote_backoff: float = 2.0
    tiresias_promote_backoff_after: int = 8
    power: PowerPolicy | None = None
    rights: PreemptionRights = field(default_factory=PreemptionRights)
    min_runtime_s: float = 600.0
    cooldown_s: float = 300.0
    max_victims: int = 512
    explain: bool = True
    shortcuts: bool = True
    placement: str = "topology"
    placement_seed: int = 0
    placement_preferences: tuple[str, ...] = ()
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.backfill not in _BACKFILL:
            raise ValueError(f"unknown backfill {self.backfill!r} (expected one of {_BACKFILL})")
        if self.priority_gap < 1:
            raise ValueError("priority_gap must be at least 1")
        if self.min_runtime_s < 0 or self.cooldown_s < 0:
            raise ValueError("min_runtime_s and cooldown_s cannot be negative")
        if self.tiresias_promote_backoff < 1 or self.tiresias_promote_backoff_after < 0:
            raise ValueError("tiresias_promote_backoff must be at least 1, and _after at least 0")
        if list(self.tiresias_thresholds) != sorted(self.tiresias_thresholds):
            raise ValueError("tiresias_thresholds must be increasing")
        if self.placement not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"unknown placement {self.placement!r} (expected one of {PLACEMENT_STRATEGIES})"
            )

    def with_queue(self, queue: str) -> SchedulerConfig:
        return replace(self, queue=queue)

    @property
    def protects(self) -> bool:
        """Whether any run may be protected from preemption (:mod:`.protection`)."""
        return self.min_runtime_s > 0 or self.cooldown_s > 0
