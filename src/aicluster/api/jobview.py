"""What a job page shows, in one answer: its state timeline, restarts and observations from the
event log, and its training from the telemetry of the latest attempt (loss curve, a per-rank
step-time heatmap with stragglers marked, checkpoints), each bounded in size however long the
job has run."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from aicluster.control.loop.health import HealthConfig, sync_jitter
from aicluster.core.numbers import ascii_int
from aicluster.store import EventRecord

__all__ = ["Training", "Transition", "timeline", "training"]

MAX_POINTS = 400  # loss curve points
MAX_BUCKETS = 60  # heatmap columns
STRAGGLER_RATIO = 1.5  # a cell this many times its column's median is marked


class Transition(BaseModel):
    at: float
    state: str
    actor: str
    reason: str | None


class Heatmap(BaseModel):
    ranks: list[int]
    steps: list[int] = Field(description="first step of each column")
    seconds: list[list[float | None]] = Field(description="mean step time per [rank][column]")
    slow: list[list[int]] = Field(description="[rank, column] cells above the column's median")


class Jitter(BaseModel):
    """Synchronization jitter (see :mod:`aicluster.control.loop.health`) over the latest steps."""

    seconds: float = Field(description="median over the steps of slowest minus fastest rank")
    nodes: dict[str, float] = Field(description="per node: its slowest rank minus the fastest")
    steps: int = Field(description="steps every rank reported, the medians are over")


class Training(BaseModel):
    attempt: int
    loss: list[tuple[int, float]] = Field(description="[step, loss] of rank 0")
    heatmap: Heatmap
    checkpoints: list[dict[str, Any]]
    last_step: int | None
    throughput: float | None = Field(description="samples/s summed over ranks, latest step")
    jitter: Jitter | None = None


def timeline(events: Iterable[EventRecord]) -> list[Transition]:
    """Every state change of the job, oldest first."""
    return [
        Transition(
            at=event.at,
            state=event.to_state,
            actor=event.actor,
            reason=_reason(event.details),
        )
        for event in events
        if event.to_state is not None
    ]


def _reason(details: Mapping[str, Any]) -> str | None:
    value = details.get("reason")
    return str(value) if value else None


def _number(value: Any) -> float | None:
    """A finite number, or None: telemetry is written by user code (a diverged loss is NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _steps(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rank's step records with an integer step, numbers cleaned."""
    found = []
    for record in records:
        step = record.get("step")
        if record.get("kind") != "step" or isinstance(step, bool) or not isinstance(step, int):
            continue
        found.append(
            {
                "step": step,
                "loss": _number(record.get("loss")),
                "step_time": _number(record.get("step_time")),
                "throughput": _number(record.get("throughput")),
                "compute_time": _number(_metrics(record).get("compute_time")),
                "node": node if isinstance(node := record.get("node"), str) else None,
            }
        )
    return found


def training(ranks: Mapping[str, Sequence[Mapping[str, Any]]], attempt: int) -> Training:
    """Summarize per-rank telemetry records (JSON objects of ``StepRecord``)."""
    numbered = {ascii_int(str(rank)): records for rank, records in ranks.items()}
    steps = {rank: _steps(records) for rank, records in numbered.items() if rank is not None}
    loss = [(r["step"], r["loss"]) for r in steps.get(0, []) if r["loss"] is not None]
    checkpoints = [
        {"step": step, "time": _number(r.get("time"))}
        for r in ranks.get("0", [])
        if r.get("kind") == "checkpoint" and (step := _number(r.get("step"))) is not None
    ]
    latest = [records[-1] for records in steps.values() if records]
    rates = [r["throughput"] for r in latest if r["throughput"] is not None]
    return Training(
        attempt=attempt,
        loss=_thin(loss, MAX_POINTS),
        heatmap=_heatmap(steps),
        checkpoints=checkpoints,
        last_step=max((r["step"] for r in latest), default=None),
        throughput=sum(rates) if rates else None,
        jitter=_jitter(steps),
    )


def _metrics(record: Mapping[str, Any]) -> Mapping[str, Any]:
    metrics = record.get("metrics")
    return metrics if isinstance(metrics, Mapping) else {}


def _jitter(steps: Mapping[int, Sequence[Mapping[str, Any]]]) -> Jitter | None:
    """The jitter of the ranks' compute times (their step time where they report none) over
    the latest steps every rank reported, as the control loop computes it."""
    if len(steps) < 2:
        return None
    window = HealthConfig().straggler_window
    by_step: dict[int, dict[int, float]] = {}
    nodes: dict[int, str] = {}
    for rank, records in steps.items():
        for record in records[-4 * window :]:
            took = record["compute_time"]
            took = took if took is not None else record["step_time"]
            if took is not None and took > 0:  # as GangMonitor.observe: no zero or negative time
                by_step.setdefault(record["step"], {})[rank] = took
            if record["node"]:
                nodes[rank] = record["node"][:256]
    complete = {step: times for step, times in by_step.items() if len(times) == len(steps)}
    found = sync_jitter(complete, nodes, window)
    if found is None:
        return None
    return Jitter(seconds=found.job, nodes=dict(found.nodes), steps=found.steps)


def _thin(points: list[tuple[int, float]], limit: int) -> list[tuple[int, float]]:
    """At most ``limit`` points, evenly spaced, keeping the last one."""
    if len(points) <= limit:
        return points
    stride = len(points) / limit
    kept = [points[int(i * stride)] for i in range(limit - 1)]
    return [*kept, points[-1]]


def _heatmap(steps: Mapping[int, Sequence[Mapping[str, Any]]]) -> Heatmap:
    ranks = sorted(steps)
    numbers = [r["step"] for records in steps.values() for r in records]
    if not numbers:
        return Heatmap(ranks=ranks, steps=[], seconds=[[] for _ in ranks], slow=[])
    low, high = min(numbers), max(numbers)
    width = max(1, -(-(high - low + 1) // MAX_BUCKETS))  # ceil: steps per column
    columns = (high - low) // width + 1
    seconds: list[list[float | None]] = []
    for rank in ranks:
        sums, counts = [0.0] * columns, [0] * columns
        for record in steps[rank]:
            if record["step_time"] is None:
                continue
            column = (record["step"] - low) // width
            sums[column] += record["step_time"]
            counts[column] += 1
        seconds.append([s / n if n else None for s, n in zip(sums, counts, strict=True)])
    return Heatmap(
        ranks=ranks,
        steps=[low + c * width for c in range(columns)],
        seconds=seconds,
        slow=_slow_cells(seconds, columns),
    )


def _slow_cells(seconds: list[list[float | None]], columns: int) -> list[list[int]]:
    """Cells at least ``STRAGGLER_RATIO`` times the median of the other ranks' cells in their
    column (the others', so that with two ranks the slow one still stands out)."""
    slow = []
    for column in range(columns):
        cells = [(i, v) for i, row in enumerate(seconds) if (v := row[column]) is not None]
        overall = statistics.median(v for _, v in cells) if cells else 0.0
        for rank_index, value in cells:
            if len(cells) < 2:
                continue
            # Many ranks: one slow rank barely moves the median, so skip the per-rank median.
            others = [v for i, v in cells if i != rank_index] if len(cells) <= 16 else None
            median = statistics.median(others) if others else overall
            if median > 0 and value >= STRAGGLER_RATIO * median:
                slow.append([rank_index, column])
    return slow
