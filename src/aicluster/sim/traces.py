"""Trace loaders: the Philly trace, a generic CSV, and the mapping of trace rows to gang jobs.

Loaders yield :class:`TraceJob` rows sorted by submission time (the engine streams them). A bad
row raises :class:`TraceError` naming the file, the line and what is wrong.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import IO, NoReturn

from aicluster.core import ANY_GPU_TYPE, ConfigError, priority_of
from aicluster.sim.trace_job import DEFAULT_TENANT, TraceJob

__all__ = [
    "PHILLY",
    "TraceError",
    "TraceJob",
    "gang_shape",
    "load_csv",
    "load_philly",
    "load_trace",
]

#: ``--trace philly`` resolves to the Philly trace shipped as package data.
PHILLY = "philly"
_EPOCH = datetime(1970, 1, 1)


class TraceError(ConfigError):
    """A trace file is malformed: ``file:line: what is wrong``."""


def gang_shape(num_gpus: int, gpus_per_node: int = 8) -> tuple[int, int]:
    """Map a job of ``num_gpus`` GPUs to ``(workers, gpus_per_worker)``.

    Traces give only a GPU count. A job that fits one node is one worker holding all its GPUs
    (1 × N). A larger job is split into the widest workers that divide both its GPU count and a
    node: workers of ``gcd(N, gpus_per_node)`` GPUs (16 → 2 × 8, 12 → 3 × 4 on 8-GPU nodes), so
    every worker fits on a node and the gang packs whole nodes whenever it can.
    """
    if num_gpus < 0:
        raise ValueError(f"a job cannot hold {num_gpus} GPUs")
    if num_gpus == 0:  # a job of CPUs and memory only
        return 1, 0
    if num_gpus <= gpus_per_node:
        return 1, num_gpus
    width = math.gcd(num_gpus, gpus_per_node)
    return num_gpus // width, width


def load_trace(name: str) -> list[TraceJob]:
    """``philly`` (the packaged trace) or a CSV path, generic or Philly-formatted, by header."""
    if name == PHILLY:
        return load_philly()
    path = Path(name)
    if not path.is_file():
        raise TraceError(name, None, "no such trace file (give 'philly' or a CSV path)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8") as handle:
        header = handle.readline()
        handle.seek(0)
        if {"timestamp", "cluster"} <= set(_columns(header)):
            return _read_philly(handle, str(path))
        return _read_csv(handle, str(path))


def load_philly(path: str | Path | None = None) -> list[TraceJob]:
    """The Philly trace (82,247 jobs), tenant = virtual cluster, times from the first arrival."""
    if path is not None:
        with gzip.open(path, "rt", newline="", encoding="utf-8") as handle:
            return _read_philly(handle, str(path))
    data = resources.files("aicluster.sim").joinpath("traces/philly.csv.gz").read_bytes()
    with io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(data)), encoding="utf-8") as handle:
        return _read_philly(handle, "philly.csv.gz")


def load_csv(path: str | Path) -> list[TraceJob]:
    """A generic CSV: ``submit_time, duration, num_gpus`` (seconds, seconds, count) and optional
    ``id, tenant, priority, gpu_type, cpus, memory_gb`` (the last two: the job's in all, 0 by
    default; a row of 0 GPUs must ask for one of them) and ``comm_sensitivity`` (0 to 1, see
    :mod:`aicluster.sim.comm`; empty: the configuration's default), ``workers`` (the gang's
    workers, dividing ``num_gpus``; empty: derived by :func:`gang_shape`),
    ``duration_estimate`` (seconds, the user's estimate), ``predicted_duration`` (seconds, the
    live cluster's prediction at submit, in a twin export), ``dataset`` and ``data_gb`` (the
    dataset the job reads and its size: :mod:`aicluster.sim.data`). Other columns are ignored;
    rows are sorted by time."""
    with open(path, newline="", encoding="utf-8") as handle:
        return _read_csv(handle, str(path))


def _columns(header: str) -> list[str]:
    return [column.strip() for column in next(csv.reader([header]), [])]


class _Rows:
    """CSV rows with their line numbers and typed field access that fails with file:line."""

    def __init__(self, handle: IO[str], source: str, required: tuple[str, ...]) -> None:
        self.source = source
        self.reader = csv.reader(handle)
        header = next(self.reader, None)
        if header is None:
            raise TraceError(source, 1, "the trace is empty (expected a header row)")
        self.columns = {name.strip(): i for i, name in enumerate(header)}
        missing = [name for name in required if name not in self.columns]
        if missing:
            raise TraceError(source, 1, f"missing column(s) {', '.join(missing)} in the header")
        self.line = 1
        self.row: list[str] = []

    def __iter__(self) -> Iterator[_Rows]:
        for row in self.reader:
            self.row = row
            self.line = self.reader.line_num
            if not self.row or not any(cell.strip() for cell in self.row):
                continue
            if len(self.row) < len(self.columns):
                self.fail(f"expected {len(self.columns)} fields, got {len(self.row)}")
            yield self

    def get(self, name: str, default: str = "") -> str:
        i = self.columns.get(name)
        return self.row[i].strip() if i is not None else default

    def fail(self, message: str) -> NoReturn:
        raise TraceError(self.source, self.line, message)

    def number(self, name: str, *, positive: bool) -> float:
        text = self.get(name)
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            kind = "a positive number" if positive else "a non-negative number"
            self.fail(f"{name} must be {kind}, got {text!r}")
        return value

    def gpus(self, name: str, *, least: int = 1) -> int:
        text = self.get(name)
        if not text.isdigit() or int(text) < least:
            self.fail(f"{name} must be a whole number of GPUs (at least {least}), got {text!r}")
        return int(text)

    def optional_number(self, name: str) -> float:
        """A non-negative number, or 0 when the column or the cell is absent."""
        return self.number(name, positive=False) if self.get(name) else 0.0

    def fraction(self, name: str) -> float | None:
        """A number from 0 to 1, or None when the column or the cell is absent."""
        if not self.get(name):
            return None
        value = self.number(name, positive=False)
        if value > 1:
            self.fail(f"{name} must lie between 0 and 1, got {self.get(name)!r}")
        return value


def _read_philly(handle: IO[str], source: str) -> list[TraceJob]:
    rows = _Rows(handle, source, ("timestamp", "duration", "num_gpus", "cluster"))
    raw: list[tuple[float, int, float, int, str]] = []
    for row in rows:
        stamp = row.get("timestamp")
        try:
            # Naive and zone-free on purpose: local DST shifts must not move arrivals.
            when = (datetime.fromisoformat(stamp) - _EPOCH).total_seconds()
        except ValueError:
            row.fail(f"timestamp must be YYYY-MM-DD HH:MM:SS, got {stamp!r}")
        tenant = row.get("cluster") or row.fail("cluster (the tenant) is empty")
        duration = row.number("duration", positive=True)
        raw.append((when, row.line, duration, row.gpus("num_gpus"), tenant))
    raw.sort()
    start = raw[0][0] if raw else 0.0
    return [
        TraceJob(f"philly-{line - 1}", when - start, duration, gpus, tenant)
        for when, line, duration, gpus, tenant in raw
    ]


def _read_csv(handle: IO[str], source: str) -> list[TraceJob]:
    rows = _Rows(handle, source, ("submit_time", "duration", "num_gpus"))
    jobs: list[tuple[float, int, TraceJob]] = []
    seen: set[str] = set()
    for row in rows:
        job_id = row.get("id") or row.get("job_id") or f"job-{row.line - 1}"
        if job_id in seen:
            row.fail(f"job id {job_id!r} appears twice")
        seen.add(job_id)
        try:
            priority = priority_of(row.get("priority") or "normal")
        except ValueError as error:
            row.fail(str(error))
        submit = row.number("submit_time", positive=False)
        gpus, cpus, memory = (
            row.gpus("num_gpus", least=0),
            row.optional_number("cpus"),
            row.optional_number("memory_gb"),
        )
        if not (gpus or cpus or memory):
            row.fail("a job must ask for GPUs, CPUs or memory (num_gpus, cpus, memory_gb)")
        job = TraceJob(
            id=job_id,
            submit_time=submit,
            duration=row.number("duration", positive=True),
            num_gpus=gpus,
            tenant=row.get("tenant") or DEFAULT_TENANT,
            priority=priority,
            gpu_type=row.get("gpu_type") or ANY_GPU_TYPE,
            cpus=cpus,
            memory_gb=memory,
            comm_sensitivity=row.fraction("comm_sensitivity"),
            workers=_workers(row, gpus),
            duration_estimate=row.number("duration_estimate", positive=True)
            if row.get("duration_estimate")
            else None,
            predicted_duration=row.number("predicted_duration", positive=True)
            if row.get("predicted_duration")
            else None,
            dataset=row.get("dataset"),
            data_gb=row.optional_number("data_gb"),
        )
        if job.data_gb and not job.dataset:
            row.fail("data_gb needs a dataset (the name its nodes cache it by)")
        jobs.append((submit, row.line, job))
    jobs.sort(key=lambda item: (item[0], item[1]))
    return [job for _, _, job in jobs]


def _workers(row: _Rows, gpus: int) -> int | None:
    """The ``workers`` cell: a whole number of workers that divides the job's GPUs, or None."""
    if not row.get("workers"):
        return None
    text = row.get("workers")
    if not text.isdigit() or int(text) < 1 or gpus % int(text):
        row.fail(
            f"workers must be a whole number (at least 1) dividing num_gpus ({gpus}), got {text!r}"
        )
    return int(text)
