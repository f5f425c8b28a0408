"""Usage per job and per tenant: GPU-hours, CPU-hours and kWh from the times a job ran.

Pure: the store reads each job's runs (its RUNNING intervals from the event log) and what it
held; this adds them up. A job's draw while it runs is the power model's (the cluster file's,
``core.GpuPower``): each of its GPUs busy and each of its CPUs; a node's base draw and idle GPUs
are the cluster's, not charged to jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from aicluster.core.topology import GpuPower

__all__ = ["JobRuns", "JobUsage", "TenantUsage", "usage"]


@dataclass(frozen=True, slots=True)
class JobRuns:
    """What one job held (GPUs and CPUs per GPU type of the nodes it ran on) and the intervals
    it ran, in Unix seconds, already clipped to the period asked for."""

    job_id: str
    tenant: str
    name: str
    held: Sequence[tuple[str, int, float]]  # (gpu_type, gpus, cpus), one per slot
    runs: Sequence[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class JobUsage:
    job_id: str
    tenant: str
    name: str
    gpus: int
    cpus: float
    run_seconds: float
    gpu_hours: float
    cpu_hours: float
    kwh: float


@dataclass(frozen=True, slots=True)
class TenantUsage:
    tenant: str
    jobs: int
    gpu_hours: float
    cpu_hours: float
    kwh: float


def usage(
    jobs: Iterable[JobRuns], power_of: Callable[[str], GpuPower]
) -> tuple[list[JobUsage], list[TenantUsage]]:
    """Each job's usage (jobs that ran in the period), and each tenant's: the sum of its jobs'."""
    rows = [_job(job, power_of) for job in jobs]
    rows = [row for row in rows if row.run_seconds > 0]
    totals: dict[str, TenantUsage] = {}
    for row in rows:
        was = totals.get(row.tenant, TenantUsage(row.tenant, 0, 0.0, 0.0, 0.0))
        totals[row.tenant] = TenantUsage(
            row.tenant,
            was.jobs + 1,
            was.gpu_hours + row.gpu_hours,
            was.cpu_hours + row.cpu_hours,
            was.kwh + row.kwh,
        )
    return rows, [totals[name] for name in sorted(totals)]


def _job(job: JobRuns, power_of: Callable[[str], GpuPower]) -> JobUsage:
    seconds = sum(max(0.0, end - start) for start, end in job.runs)
    gpus = sum(g for _, g, _ in job.held)
    cpus = sum(c for _, _, c in job.held)
    watts = sum(
        g * power_of(gpu_type).busy_watts + c * power_of(gpu_type).cpu_watts
        for gpu_type, g, c in job.held
    )
    return JobUsage(
        job.job_id,
        job.tenant,
        job.name,
        gpus,
        cpus,
        seconds,
        gpus * seconds / 3600,
        cpus * seconds / 3600,
        watts * seconds / 3.6e6,
    )
