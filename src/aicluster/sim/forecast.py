"""Estimated start times of queued jobs (like Slurm's ``squeue --start``): the simulator run
forward from a live scheduler state, with the same scheduler and its settings.

The forecast copies what it reads (the live state is never changed): the nodes and whether each
takes work, the running jobs at their placements, the queue with each job's place and progress.
A job holds its GPUs for its launch (``launch_s``: the live loop gives the median of its latest
launches, :mod:`aicluster.control.loop.launchtimes`) and then its ``duration_estimate`` (the user's,
or the live prediction, :mod:`aicluster.control.loop.predictions`): a running job is expected to end
at its admission plus the launch plus what its estimate leaves after its earlier runs; one
already past that is expected to end :data:`OVERDUE_S` from now; one with no estimate holds its
GPUs to the end of the forecast. At each expected end the scheduling cycle runs (``schedule()``,
as live) and starts what it admits. A queued job's estimated start is the first start the
forecast gives it; None when it gets none within ``horizon_s``.

Power saving is in: each node starts as the live loop has it (off nodes are resumed when the
queue needs them and take ``resume_time`` to come back; suspends and resumes under way end when
the live loop expects). Left out: node failures, a resume that fails, the time to fetch data (a
job's run time includes its reading; the locality term, which weighs cached data among equal
nodes, has none to weigh), and the time the live loop takes to notice an end (up to a tick).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from aicluster.core import ManualClock
from aicluster.scheduler import PendingEntry, RunningEntry, SchedulerState
from aicluster.sim.config import SimConfig
from aicluster.sim.engine import Simulator

__all__ = ["OVERDUE_S", "ForecastOptions", "estimate_starts", "expected_end", "prepare_forecast"]

#: A running job past its estimate is expected to end this long from now.
OVERDUE_S = 60.0


@dataclass(frozen=True, slots=True)
class ForecastOptions:
    """How often the live loop forecasts (``interval_s``), how far ahead (``horizon_s``) and
    for how many queued jobs at most (``max_jobs``, the first in queue order). ``background``:
    the loop runs each forecast on a worker thread and shows its estimates from the first tick
    after it ends (off: within the tick that starts it, which then waits for it)."""

    interval_s: float = 30.0
    horizon_s: float = 7 * 86_400.0
    max_jobs: int = 1000
    background: bool = True

    def __post_init__(self) -> None:
        if self.interval_s < 0 or self.horizon_s <= 0 or self.max_jobs < 1:
            raise ValueError("interval_s >= 0, horizon_s > 0 and max_jobs >= 1 are required")


def expected_end(running: RunningEntry, now: float, launch_s: float = 0.0) -> float | None:
    """When ``running`` is expected to end: its admission plus ``launch_s`` plus the rest of its
    estimate (None: it gives none); :data:`OVERDUE_S` from ``now`` once past that."""
    estimate = running.job.duration_estimate
    if estimate is None:
        return None
    remaining = max(0.0, estimate - running.executed_before) / running.speed
    end = running.started_at + launch_s + remaining
    return end if end > now else now + OVERDUE_S


def estimate_starts(
    state: SchedulerState,
    now: float,
    queued: Iterable[str],
    horizon_s: float,
    launch_s: float = 0.0,
) -> dict[str, float | None]:
    """The estimated start (admission) of each job of ``queued`` (ids of ``state``'s pending
    jobs; the other pending jobs are left out of the forecast), from ``now`` on: a time not
    before ``now``, or None when none is found within ``horizon_s``. Each job's gang takes
    ``launch_s`` to launch before it runs."""
    return prepare_forecast(state, now, queued, horizon_s, launch_s)()


def prepare_forecast(
    state: SchedulerState,
    now: float,
    queued: Iterable[str],
    horizon_s: float,
    launch_s: float = 0.0,
) -> Callable[[], dict[str, float | None]]:
    """:func:`estimate_starts` in two steps: this one copies what the forecast reads of
    ``state`` (call it where ``state`` is not changing: the live loop's tick); the call it
    returns runs the forecast on those copies alone, on any thread."""
    forecast = _simulator(state, now, horizon_s)
    waiting = [state.pending[job_id] for job_id in queued]
    running = ((entry, expected_end(entry, now, launch_s)) for entry in state.running.values())
    forecast.resume(running, [_without_data(entry) for entry in waiting], launch_s)
    ids = [entry.job.id for entry in waiting]

    def run() -> dict[str, float | None]:
        forecast.run()
        table = forecast.table
        starts = dict(zip(table.ids, table.start, strict=True))
        return {job_id: None if math.isnan(t := starts[job_id]) else t for job_id in ids}

    return run


def _simulator(state: SchedulerState, now: float, horizon_s: float) -> Simulator:
    """An empty simulator of ``state``'s nodes, tenants and scheduler settings, at ``now``."""
    settings = SimConfig(
        failures=False,
        restart_overhead=0.0,
        until=now + horizon_s,
        sample_step=now + 2 * horizon_s,  # one sample (at 0): the forecast reads no series
    )
    simulator = Simulator(
        state.cluster,
        (),
        tenants=dict(state.tenants),
        scheduler=state.config,
        config=settings,
        clock=ManualClock(now),
    )
    power = simulator.state.power
    if power is not None and state.power is not None:
        power.follow(state.power)  # which nodes are on, off, coming back
        return simulator
    index = state.index
    for i, node in enumerate(index.nodes):
        simulator.state.set_node_schedulable(node.name, index.schedulable[i])
    return simulator


def _without_data(entry: PendingEntry) -> PendingEntry:
    """``entry`` as the forecast queues it: without datasets (no fetch time, and no data
    locality term among otherwise equal nodes)."""
    if not entry.job.data:
        return entry
    return replace(entry, job=replace(entry.job, data=()))
