"""Launch and stop gangs off the loop's thread: Ray calls block for seconds."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Launcher", "Outcome"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """What a background call returned (or raised), collected by the loop's next tick."""

    job_id: str
    kind: str  # "launch", "stop" or "release"
    attempt: int
    value: Any = None
    error: BaseException | None = None
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Call:
    outcome: Outcome
    call: Callable[[], Any]


class Launcher:
    """Runs launch/stop calls on a small thread pool. Calls for one job run one after another,
    in the order submitted (a stop waits for the launch before it, a new launch for the release
    of the previous attempt); calls for different jobs run in parallel.

    ``guard`` runs just before each call and may raise to refuse it (the call's outcome then
    carries that error): the loop checks there that this server still holds the leader lease,
    so a deposed leader whose calls were queued acts on Ray no more.

    ``executor`` replaces the thread pool: the loop's logic tests pass one that runs each call
    at once, in the caller's thread, so a tick's calls have their outcomes by the next tick."""

    def __init__(
        self,
        workers: int = 4,
        guard: Callable[[], None] | None = None,
        executor: Executor | None = None,
    ) -> None:
        self._pool = executor or ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="aicluster-gang"
        )
        self._guard = guard
        # Reentrant: a call that has already finished runs its done-callback (which takes the
        # lock) inside add_done_callback, i.e. inside submit, which holds the lock.
        self._lock = threading.RLock()
        self._queues: dict[str, deque[_Call]] = {}
        self._done: list[Outcome] = []

    def busy(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._queues

    def submit(
        self, job_id: str, kind: str, attempt: int, call: Callable[[], Any], **context: Any
    ) -> None:
        item = _Call(Outcome(job_id, kind, attempt, context=dict(context)), call)
        with self._lock:
            queue = self._queues.setdefault(job_id, deque())
            queue.append(item)
            if len(queue) == 1:
                self._start(item)

    def _start(self, item: _Call) -> None:
        future = self._pool.submit(lambda: self._guarded(item.call))
        future.add_done_callback(lambda done: self._finished(item, done))

    def _guarded(self, call: Callable[[], Any]) -> Any:
        if self._guard is not None:
            self._guard()
        return call()

    def _finished(self, item: _Call, done: Future[Any]) -> None:
        try:
            item.outcome.value = done.result()
        except BaseException as error:  # handed to the loop, which decides
            item.outcome.error = error
        with self._lock:
            self._done.append(item.outcome)
            queue = self._queues[item.outcome.job_id]
            queue.popleft()
            if queue:
                self._start(queue[0])
            else:
                del self._queues[item.outcome.job_id]

    def collect(self) -> list[Outcome]:
        """Calls finished since the last collect, in the order they finished."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
