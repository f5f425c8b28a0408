"""Launch and stop gangs off the loop's thread: Ray calls block for seconds."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Launcher", "Outcome"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """What a background call returned (or raised), collected by the loop's next tick."""

    job_id: str
    kind: str  # "launch" or "stop"
    attempt: int
    value: Any = None
    error: BaseException | None = None
    context: dict[str, Any] = field(default_factory=dict)


class Launcher:
    """Runs launch/stop calls on a small thread pool, one call in flight per job."""

    def __init__(self, workers: int = 4) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aicluster-gang")
        self._busy: dict[str, Future[Any]] = {}
        self._done: list[Outcome] = []

    def busy(self, job_id: str) -> bool:
        return job_id in self._busy

    def submit(
        self, job_id: str, kind: str, attempt: int, call: Callable[[], Any], **context: Any
    ) -> bool:
        """Start ``call`` unless one is already in flight for the job. Returns whether it did."""
        if job_id in self._busy:
            return False
        future = self._pool.submit(call)
        self._busy[job_id] = future

        def collect(done: Future[Any]) -> None:
            outcome = Outcome(job_id, kind, attempt, context=dict(context))
            try:
                outcome.value = done.result()
            except BaseException as error:
                outcome.error = error
            self._done.append(outcome)

        future.add_done_callback(collect)
        return True

    def collect(self) -> list[Outcome]:
        """Finished calls since the last collect (list swap is atomic under the GIL)."""
        done, self._done = self._done, []
        for outcome in done:
            self._busy.pop(outcome.job_id, None)
        return done

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
