"""Time, injected: decision code never reads the wall clock itself."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock"]


@runtime_checkable
class Clock(Protocol):
    """Seconds since an arbitrary epoch; the simulator and the live control plane each give one."""

    def now(self) -> float: ...


class ManualClock:
    """A clock that moves only when told to: the simulator's clock and the tests'."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, when: float) -> None:
        if when < self._now:
            raise ValueError(f"time cannot go backwards ({when} < {self._now})")
        self._now = when

    def advance(self, seconds: float) -> None:
        self.advance_to(self._now + seconds)
