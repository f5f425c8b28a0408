"""The queued jobs' estimated starts, like ``squeue --start``: the control loop's forecasts of
its queue (:mod:`aicluster.sim.forecast`, the simulator run forward from the loop's state). A
forecast begins at most once every ``estimates.interval_s``, on its own thread so that the tick
does not wait for it (``background``); what it reads is copied in the tick, and its estimates
show from the first tick after it ends. They are advice: a forecast that fails leaves none and
costs the tick nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from aicluster.control.loop.launchtimes import LaunchTimes
from aicluster.scheduler import SchedulerState
from aicluster.sim.forecast import ForecastOptions, prepare_forecast

if TYPE_CHECKING:
    from aicluster.control.loop.loop import LoopStats

__all__ = ["StartEstimates"]

log = logging.getLogger(__name__)

Estimates = dict[str, float | None]


class StartEstimates:
    """The latest forecast's estimates (:attr:`by_job`) and the one running, if any; counted in
    the loop's ``stats``."""

    def __init__(self, stats: LoopStats) -> None:
        self.stats = stats
        #: Queued jobs' estimated starts by job id, as of the latest forecast (None: none found).
        self.by_job: Estimates = {}
        self.running: Future[tuple[Estimates, float]] | None = None
        self._began_at = -math.inf
        #: Forecasts run here, one at a time (sim/forecast.py: the simulator, pure Python).
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="aicluster-forecast")

    def update(
        self,
        state: SchedulerState,
        order: list[str],
        now: float,
        options: ForecastOptions | None,
        launch_times: LaunchTimes,
    ) -> None:
        """Forecast the queued jobs' starts (``order``: the queue's order) once
        ``options.interval_s`` has passed since the last forecast began, or at once when a job
        queues after the queue was empty. The copies it reads are made here; the forecast itself
        runs on the forecast thread (with ``background``), and its estimates show from the first
        tick after it ends."""
        if options is None or not order:
            self.by_job, self._began_at = {}, -math.inf
            return
        self._collect()
        if self.running is not None or now < self._began_at + options.interval_s:
            return
        self._began_at = now
        try:
            queued, launch_s = order[: options.max_jobs], launch_times.typical
            run = prepare_forecast(state, now, queued, options.horizon_s, launch_s)
        except Exception:  # advisory: a failed forecast must not cost the tick
            log.exception("estimating start times failed: the queue shows none")
            self.by_job = {}
            return
        self.running = self._pool.submit(_timed, run)
        if not options.background:
            futures.wait([self.running])
            self._collect()

    def _collect(self) -> None:
        """Take a finished forecast's estimates (a failed one leaves none)."""
        done = self.running
        if done is None or not done.done():
            return
        self.running = None
        try:
            self.by_job, self.stats.last_forecast_seconds = done.result()
        except Exception:  # advisory, as above
            log.exception("estimating start times failed: the queue shows none")
            self.by_job = {}
        self.stats.forecasts += 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _timed(run: Callable[[], Estimates]) -> tuple[Estimates, float]:
    started = time.perf_counter()
    return run(), time.perf_counter() - started
