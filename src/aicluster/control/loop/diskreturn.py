"""Giving back ended jobs' disks (runtime/sandbox/jobdisk.py) off the control loop's tick.

A give-back copies an ended job's files out of its image (``cp -a``), which takes as long as
the job's files make it: a tenant's million small files must not stop scheduling for everyone.
So the tick only starts one, here, on a thread of its own: at most one at a time and at most
every ``interval_s`` of the loop's clock. A give-back cut short (a crash, a lost lease) leaves
the image, and the next one finishes it: the sweep is idempotent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["DiskGiveBack"]

log = logging.getLogger(__name__)

INTERVAL_S = 5.0


class DiskGiveBack:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.running: Future[object] | None = None
        self._began_at = -math.inf
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="aicluster-disks")

    def kick(self, now: float, give_back: Callable[[], object]) -> bool:
        """Start ``give_back`` on the disks' thread unless one runs or one began less than
        ``interval_s`` ago; returns whether it started. Never waits for it."""
        if self.running is not None and not self.running.done():
            return False
        if now - self._began_at < self.interval_s:
            return False
        self._began_at = now
        self.running = self._pool.submit(give_back)
        self.running.add_done_callback(_log_failure)
        return True

    def shutdown(self) -> None:
        """Stop taking new ones; a running one ends on its own (the pool's thread is not
        waited for: the next leader's sweep finishes whatever is cut short)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _log_failure(future: Future[object]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("giving back the disks of ended jobs failed: %s", future.exception())
