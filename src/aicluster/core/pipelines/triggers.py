"""When a pipeline fires: a pure function of its triggers, what it remembers and what is seen now.

The driver calls :func:`evaluate` about every second with an :class:`Observation` (the served
version's drift score, each watched dataset's newest version, whether a run is in progress or
the pipeline is paused) and stores the returned :class:`Memory`. Rules:

- *drift*: the score has been at or over the threshold at every look since ``drift_since``, and
  that is at least ``sustained_s`` ago; a look without a score (too few samples) or under the
  threshold restarts the wait.
- *new data*: a watched dataset's newest version is above the one seen when the pipeline last
  fired (or was created).
- *schedule*: ``schedule_s`` has passed since it last fired (or was created).

Triggers that hold together fire **one** run, with every reason. Nothing fires while a run is in
progress or the pipeline is paused (a new dataset version stays pending until then; drift keeps
being measured). After a run ends, drift and schedule wait ``cooldown_s``: a rolled-back
version would otherwise be retrained again at once on the same drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aicluster.core.pipelines.spec import Triggers

__all__ = ["Decision", "Memory", "Observation", "evaluate"]


@dataclass(frozen=True)
class Memory:
    """What a pipeline remembers between looks (kept as JSON in its row)."""

    seen: Mapping[str, int] = field(default_factory=dict)  # dataset -> version at the last fire
    last_fired: float = 0.0  # when it last fired (created: its creation time)
    last_ended: float | None = None  # when its last run ended
    drift_since: float | None = None  # first look of the current streak over the threshold

    def to_json(self) -> dict[str, Any]:
        return {
            "seen": dict(self.seen),
            "last_fired": self.last_fired,
            "last_ended": self.last_ended,
            "drift_since": self.drift_since,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Memory:
        return cls(
            seen={str(k): int(v) for k, v in (data.get("seen") or {}).items()},
            last_fired=float(data.get("last_fired") or 0.0),
            last_ended=data.get("last_ended"),
            drift_since=data.get("drift_since"),
        )


@dataclass(frozen=True)
class Observation:
    now: float
    drift_score: float | None  # None: no score yet (too few samples, nothing served)
    newest: Mapping[str, int]  # watched dataset -> its newest version (absent: none)
    busy: bool = False  # a run of this pipeline is in progress
    paused: bool = False


@dataclass(frozen=True)
class Decision:
    reasons: tuple[str, ...]  # empty: do not fire
    memory: Memory

    @property
    def fire(self) -> bool:
        return bool(self.reasons)


def evaluate(triggers: Triggers, cooldown_s: float, memory: Memory, seen: Observation) -> Decision:
    """Whether to start a retraining now, why, and what to remember."""
    memory = replace(memory, drift_since=_drift_since(triggers, memory, seen))
    if seen.busy or seen.paused:
        return Decision((), memory)
    cooled = memory.last_ended is None or seen.now - memory.last_ended >= cooldown_s
    reasons = []
    drift = triggers.drift
    since = memory.drift_since
    if drift is not None and since is not None and cooled and seen.now - since >= drift.sustained_s:
        reasons.append(
            f"drift {seen.drift_score or 0:.3f} >= {drift.threshold:g} for {seen.now - since:.0f} s"
        )
    for name in triggers.new_data:
        newest = seen.newest.get(name, 0)
        if newest > memory.seen.get(name, 0):
            reasons.append(f"new version {name}:{newest}")
    every = triggers.schedule_s
    if every is not None and cooled and seen.now - memory.last_fired >= every:
        reasons.append(f"schedule: {seen.now - memory.last_fired:.0f} s since the last run")
    if not reasons:
        return Decision((), memory)
    watched = {name: seen.newest[name] for name in triggers.new_data if name in seen.newest}
    fired = Memory({**memory.seen, **watched}, seen.now, memory.last_ended, None)
    return Decision(tuple(reasons), fired)


def _drift_since(triggers: Triggers, memory: Memory, seen: Observation) -> float | None:
    drift = triggers.drift
    if drift is None or seen.drift_score is None or seen.drift_score < drift.threshold:
        return None
    return memory.drift_since if memory.drift_since is not None else seen.now
