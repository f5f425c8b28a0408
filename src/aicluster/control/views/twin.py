"""Reading the live cluster's history out of the store as a twin (:mod:`aicluster.sim.twin`):
the trace of the jobs submitted in a window, the nodes, the configuration in force, and the
window's cost of preemption per tenant (:mod:`aicluster.core.preemption_cost`, the figures a
replay's ``preemption-cost.csv`` gives for the same jobs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aicluster.core.preemption_cost import CostLedger
from aicluster.sim.twin import TwinJob, cluster_text, config_text, runs_of, trace_text
from aicluster.store import EventRecord, JobRecord, Store

__all__ = ["TwinExport", "export_twin", "twin_job"]

_PAGE = 1000


@dataclass(frozen=True, slots=True)
class TwinExport:
    trace_csv: str
    cluster_yaml: str
    config_yaml: str
    jobs: int  # rows in the trace
    origin: float  # Unix time of the trace's t=0
    #: Per tenant, the exported jobs' preemptions by kind, lost and admitted GPU-hours.
    preemption_cost: dict[str, dict[str, Any]] = field(default_factory=dict)


def export_twin(store: Store, since: float | None = None, until: float | None = None) -> TwinExport:
    """The jobs submitted in ``[since, until)`` (None: unbounded) that ran and ended, with the
    nodes and the configuration as they are now. t=0 is ``since``, else the first submission."""
    ledger = CostLedger()
    jobs = []
    for record in _window(store, since, until):
        events = store.events(record.id)
        job = twin_job(store, record, events)
        jobs.append(job)
        _account(ledger, job.workers * job.gpus_per_worker, events)
    ran = [job for job in jobs if job.runs]
    origin = since if since is not None else min((job.submitted_at for job in ran), default=0.0)
    applied = store.current_config()
    return TwinExport(
        trace_csv=trace_text(ran, origin),
        cluster_yaml=cluster_text([record.node for record in store.list_nodes()]),
        config_yaml=config_text(None if applied is None else applied.text, store.list_tenants()),
        jobs=len(ran),
        origin=origin,
        # (ended jobs only: no run is open, whatever "now" the ledger is asked at)
        preemption_cost={t: c.figures() for t, c in sorted(ledger.costs(origin).items())},
    )


def _account(ledger: CostLedger, gpus: int, events: Sequence[EventRecord]) -> None:
    for event in events:
        if event.kind == "job.transition" and event.job_id and event.to_state:
            ledger.transition(
                event.job_id, event.tenant or "", gpus, event.at, event.to_state, event.details
            )


def _window(store: Store, since: float | None, until: float | None) -> list[JobRecord]:
    """Ended batch jobs submitted in the window. Pages come newest first by id, and ids grow
    with the submission time, so the walk stops at the first page entirely before ``since``."""
    found: list[JobRecord] = []
    cursor: str | None = None
    while True:
        page, cursor = store.list_jobs(None, limit=_PAGE, cursor=cursor)
        for record in page:
            inside = (since is None or record.submitted_at >= since) and (
                until is None or record.submitted_at < until
            )
            if inside and record.state.terminal and not record.is_service:
                found.append(record)
        older = since is not None and all(record.submitted_at < since for record in page)
        if cursor is None or older:
            return found


def twin_job(
    store: Store, record: JobRecord, events: Sequence[EventRecord] | None = None
) -> TwinJob:
    """A job record with its runs, read from its events (``events``: already read)."""
    events = store.events(record.id) if events is None else events
    transitions = [(event.at, event.to_state) for event in events if event.to_state]
    predicted = next((e.details.get("estimate") for e in events if e.kind == "job.predicted"), None)
    runs, restarts = runs_of(transitions)
    spec = record.spec
    job = record.to_job()
    return TwinJob(
        id=record.id,
        tenant=record.tenant,
        user=record.submitted_by,
        name=record.name,
        submitted_at=record.submitted_at,
        priority=record.priority,
        workers=spec.workers,
        gpus_per_worker=spec.resources.gpus,
        gpu_type=spec.resources.gpu_type,
        cpus_per_worker=spec.resources.cpus,
        memory_gb_per_worker=spec.resources.memory_gb,
        parallelism=(job.parallelism.data, job.parallelism.tensor, job.parallelism.pipeline),
        duration_estimate=spec.duration_estimate,
        predicted_duration=_seconds(predicted),
        outcome=record.state.value,
        runs=runs,
        restarts=restarts,
    )


def _seconds(value: object) -> float | None:
    """A recorded prediction as a positive number of seconds, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None
