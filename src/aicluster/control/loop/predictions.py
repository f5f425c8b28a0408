"""Predicted run times in the live loop: a job that gives no ``duration_estimate`` enters the
scheduler's state with its predicted median run time (``aicluster.sim.predict``), which sjf,
srtf and backfill read; the model is retrained on the schedule the configuration gives, over
the run times of the jobs that succeeded (their final runs, as ``twin export`` measures them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aicluster.control.settings import ACTOR
from aicluster.control.views.twin import twin_job
from aicluster.core import Job, JobState
from aicluster.sim.predict import Prediction, PredictionOptions, Sample
from aicluster.store import JobRecord, Store

__all__ = ["LivePredictions", "sample_from"]

#: The newest succeeded jobs a retraining reads (each costs a read of its events).
HISTORY_LIMIT = 5000
#: Predictions kept for the API, newest (a long-running loop forgets the oldest).
KEPT = 100_000


class LivePredictions:
    def __init__(self, store: Store, options: PredictionOptions) -> None:
        self.store = store
        self.online = options.predictor()
        self.predicted: dict[str, Prediction] = {}  # by job id: what each job was told

    def job(self, record: JobRecord, now: float) -> Job:
        """The scheduler's view of ``record``, with the prediction as its estimate where the
        spec gives none and the model has one (none: the job is as submitted)."""
        job = record.to_job()
        if job.duration_estimate is not None:
            return job
        prediction = self.predicted.get(record.id)
        if prediction is None:  # the first time this loop takes it in: predicted once, kept
            prediction = self._predict(record, now)
        estimate = prediction.estimate
        return job if estimate is None else replace(job, duration_estimate=estimate)

    def _predict(self, record: JobRecord, now: float) -> Prediction:
        """Predict ``record`` with the model as it is now, and record what it was told (a
        ``job.predicted`` event: the twin's export replays it as the live cluster decided)."""
        if now >= self.online.next_fit:
            self.online.history = finished_samples(self.store)
        prediction = self.predicted[record.id] = self.online.estimate(sample_from(record), now)
        if len(self.predicted) > KEPT:
            del self.predicted[next(iter(self.predicted))]
        if prediction.estimate is not None:
            details = {"estimate": prediction.estimate} | self.described(record.id)
            self.store.record_event(record.id, "job.predicted", ACTOR, details)
        return prediction

    def described(self, job_id: str) -> dict[str, Any]:
        """What ``job_id`` was told, as the API shows it."""
        told = self.predicted[job_id]
        quantiles = {str(q): round(value, 1) for q, value in told.quantiles.items()}
        return {"quantiles": quantiles, "source": told.source, "trained_on": told.trained_on}


def sample_from(record: JobRecord, duration: float | None = None) -> Sample:
    spec = record.spec
    return Sample(
        tenant=record.tenant,
        user=record.submitted_by,
        name=record.name,
        gpus=spec.workers * spec.resources.gpus,
        workers=spec.workers,
        cpus=spec.workers * spec.resources.cpus,
        memory_gb=spec.workers * spec.resources.memory_gb,
        requested=spec.duration_estimate,
        duration=duration,
    )


def finished_samples(store: Store, limit: int = HISTORY_LIMIT) -> list[Sample]:
    """The newest succeeded batch jobs, up to ``limit``, with their final runs' lengths."""
    samples: list[Sample] = []
    cursor: str | None = None
    while len(samples) < limit:
        page, cursor = store.list_jobs(None, state=JobState.SUCCEEDED, limit=1000, cursor=cursor)
        for record in page:
            runs = twin_job(store, record).runs
            if runs and not record.is_service:
                samples.append(sample_from(record, runs[-1].end - runs[-1].start))
        if cursor is None:
            break
    return samples[:limit]
