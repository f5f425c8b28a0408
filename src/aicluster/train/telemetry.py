"""Per-rank step telemetry: one JSON object per line, appended by the job, tailed by the runtime.

A file per rank needs no server and no connection: it survives a restart of the control plane,
and a reader resumes from a byte offset. Lines are short and written with a single ``write``
followed by a flush, so a reader sees whole lines (a partial last line is left for the next read).
Records carry the wall time of the writer so the control plane can spot hangs (no record for a
while) and stragglers (one rank's ``step_time`` above its peers').
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["StepRecord", "TelemetryWriter", "read_records"]

_BASE_FIELDS = (
    "kind",
    "rank",
    "time",
    "step",
    "loss",
    "step_time",
    "samples",
    "throughput",
    "node",
    "attempt",
)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One telemetry record. ``kind`` is ``start``, ``step``, ``checkpoint``, ``resume`` or ``end``.

    ``step_time`` is seconds since the rank's previous ``start`` or ``step`` record; ``throughput``
    is samples per second over that interval. ``metrics`` holds whatever else the job reported
    (numbers). A ``checkpoint`` record (rank 0, once a checkpoint is complete) has the ``step``
    saved and ``metrics`` ``seconds`` (save call to commit), ``stall_seconds`` (how long the
    save call held the training loop) and ``bytes``. A ``resume`` record (rank 0, after a
    checkpoint was loaded) has the ``step`` loaded and ``seconds`` the load took.
    """

    kind: str
    rank: int
    time: float
    step: int | None = None
    loss: float | None = None
    step_time: float | None = None
    samples: int | None = None
    throughput: float | None = None
    node: str | None = None
    attempt: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        data: dict[str, Any] = {
            name: getattr(self, name) for name in _BASE_FIELDS if getattr(self, name) is not None
        }
        if self.metrics:
            data["metrics"] = dict(self.metrics)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> StepRecord:
        data = json.loads(line)
        known = {name: data[name] for name in _BASE_FIELDS if name in data}
        return cls(**known, metrics=dict(data.get("metrics", {})))


class TelemetryWriter:
    """Appends records to one rank's file; measures the step time between consecutive reports.

    Thread-safe: a background checkpoint writer reports through the same file as the loop.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, rank: int, node: str | None, attempt: int | None
    ) -> None:
        self.rank, self.node, self.attempt = rank, node, attempt
        self._file: IO[str] | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the job
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def write(self, kind: str, **fields: Any) -> StepRecord:
        with self._lock:
            return self._write(kind, fields)

    def _write(self, kind: str, fields: dict[str, Any]) -> StepRecord:
        now = time.monotonic()
        if kind == "step" and fields.get("step_time") is None:
            fields["step_time"] = now - self._last
        if kind in ("start", "step"):  # a checkpoint record must not split a step's time
            self._last = now
        samples, step_time = fields.get("samples"), fields.get("step_time")
        if kind == "step" and samples is not None and step_time:
            fields.setdefault("throughput", samples / step_time)
        record = StepRecord(
            kind=kind,
            rank=self.rank,
            time=time.time(),
            node=self.node,
            attempt=self.attempt,
            **fields,
        )
        if self._file is not None:
            self._file.write(record.to_json() + "\n")
            self._file.flush()
        return record

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_records(path: str | os.PathLike[str], offset: int = 0) -> tuple[list[StepRecord], int]:
    """Records in ``path`` from byte ``offset`` on, and the offset to resume from.

    A missing file reads as empty; a partial last line (still being written) is not consumed.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return list(_parse(data[:end])), offset + end


def _parse(data: bytes) -> Iterator[StepRecord]:
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            yield StepRecord.from_json(raw.decode("utf-8"))
        except (ValueError, TypeError):
            continue  # a line from a crashed writer or a foreign format: skip, keep the rest
