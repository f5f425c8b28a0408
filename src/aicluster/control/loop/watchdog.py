"""A watchdog over the control loop's ticks: reports a tick that runs over its budget.

A tick that never ends (a read that blocks, a lock never released) cannot report itself, so a
thread of its own watches: when the running tick is older than ``budget_s`` it logs a warning
with the loop thread's stack (where it is stuck) and counts it, once per tick.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback

__all__ = ["TickWatchdog"]

log = logging.getLogger(__name__)


class TickWatchdog:
    """Call :meth:`begin` and :meth:`end` around each tick from the loop's thread."""

    def __init__(self, budget_s: float, poll_s: float = 1.0) -> None:
        self.budget_s, self.poll_s = budget_s, poll_s
        self.over_budget = 0  # ticks reported
        self.longest_s = 0.0
        self._started: float | None = None
        self._thread_id: int | None = None
        self._reported = False
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name="aicluster-watchdog", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        self._halt.set()

    def begin(self) -> None:
        with self._lock:
            self._started, self._reported = time.monotonic(), False
            self._thread_id = threading.get_ident()

    def end(self) -> None:
        with self._lock:
            if self._started is not None:
                self.longest_s = max(self.longest_s, time.monotonic() - self._started)
            self._started = None

    def running_s(self) -> float:
        """How long the current tick has run (0 between ticks)."""
        with self._lock:
            return 0.0 if self._started is None else time.monotonic() - self._started

    def check(self) -> bool:
        """Report the running tick if it is over budget (once per tick); True when it did."""
        with self._lock:
            if self._started is None or self._reported:
                return False
            took = time.monotonic() - self._started
            if took <= self.budget_s:
                return False
            self._reported = True
            self.over_budget += 1
            thread_id = self._thread_id
        frame = sys._current_frames().get(thread_id or 0)
        where = "".join(traceback.format_stack(frame)[-6:]) if frame is not None else "?"
        log.warning(
            "control loop: a tick has run %.1fs, over its %.1fs budget; it is at:\n%s",
            took,
            self.budget_s,
            where,
        )
        return True

    def _watch(self) -> None:
        while not self._halt.wait(self.poll_s):
            self.check()
