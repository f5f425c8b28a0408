"""Node power states and the power-saving policy (the configuration file's ``power:`` section).

A node is ``on`` (holding work), ``idle`` (on, holding none), ``suspending`` (being powered
down), ``off``, ``resuming`` (being powered up) or ``failed`` (a resume that did not come back:
the node stays out of placement until an operator brings it back). Only ``on`` and ``idle``
nodes take work; the hardware facts (watts) stay in the cluster file.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["PowerPolicy", "PowerState", "Transition"]


class PowerState(StrEnum):
    ON = "on"
    IDLE = "idle"
    SUSPENDING = "suspending"
    OFF = "off"
    RESUMING = "resuming"
    FAILED = "failed-to-resume"


@dataclass(frozen=True, slots=True)
class PowerPolicy:
    """When idle nodes are powered down and how long each way takes, in seconds.

    ``min_nodes_on`` and ``min_nodes_on_per_rack`` are floors of nodes kept on (on, idle or
    resuming), cluster-wide and in each rack: warm capacity for the next job.
    ``resume_timeout`` (live only; None: twice ``resume_time``): a resume not done by then has
    failed. (The simulator's resumes take exactly ``resume_time``.)"""

    suspend_after: float = 600.0
    suspend_time: float = 60.0
    resume_time: float = 300.0
    min_nodes_on: int = 0
    min_nodes_on_per_rack: int = 0
    resume_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.suspend_after <= 0:
            raise ValueError("suspend_after must be positive")
        if self.suspend_time < 0 or self.resume_time < 0:
            raise ValueError("suspend_time and resume_time cannot be negative")
        if self.resume_timeout is not None and self.resume_timeout <= 0:
            raise ValueError("resume_timeout must be positive")
        if self.min_nodes_on < 0 or self.min_nodes_on_per_rack < 0:
            raise ValueError("the floors of nodes kept on cannot be negative")


@dataclass(frozen=True, slots=True)
class Transition:
    """Node ``node`` went from ``before`` to ``after`` at ``at``; a suspend or resume started
    then ends at ``done_at`` (None for a transition that is itself the end)."""

    node: str
    before: PowerState
    after: PowerState
    at: float
    done_at: float | None = None
