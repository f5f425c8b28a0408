"""Predicted run times in the live loop (control/loop/predictions.py): a job without an estimate
enters the scheduler's state with the median the model learned from the store's succeeded jobs;
a job with one keeps it; with too little history the job stays as submitted. Real store
(SQLite), a real ControlLoop without Ray."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest
from apiserver import RunningServer, serve
from liveplane import leading, open_live_plane, racks, submit, users, wait_for

from aicluster.control.loop.loop import ControlLoop
from aicluster.control.loop.predictions import LivePredictions
from aicluster.control.settings import LoopSettings
from aicluster.control.views.twin import twin_job
from aicluster.core import JobState, ManualClock, Node, Tenant, jobspec_from_mapping
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import TraceJob, load_csv
from aicluster.sim.predict import PredictionOptions
from aicluster.sim.twin import Run, TwinJob, trace_text
from aicluster.store import Role, Store

pytestmark = pytest.mark.integration


def spec(name: str, estimate: float | None = None) -> object:
    fields: dict[str, object] = {"name": name, "entrypoint": "t.py", "resources": {"gpus": 1}}
    if estimate is not None:
        fields["duration_estimate"] = estimate
    return jobspec_from_mapping(fields)


def history(store: Store, clock: ManualClock, runs: int) -> None:
    """``runs`` succeeded jobs per tenant: a's 'short' ones run 60 s, b's 'long' ones 600 s."""
    for i in range(runs):
        for tenant, name, seconds in (("a", "short", 60.0 + i % 3), ("b", "long", 600.0 + i)):
            record, _ = store.submit_job(tenant, spec(name), "u")  # type: ignore[arg-type]
            store.transition(record.id, JobState.STARTING, "test")
            store.transition(record.id, JobState.RUNNING, "test")
            clock.advance(seconds)
            store.transition(record.id, JobState.SUCCEEDED, "test")


def open_store(tmp_path: Path, clock: ManualClock) -> Store:
    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}", clock=clock)
    for name in ("a", "b"):
        store.create_tenant(Tenant(name), "test")
    return store


def test_a_job_without_an_estimate_gets_the_learned_median(tmp_path: Path) -> None:
    clock = ManualClock(1_700_000_000.0)
    store = open_store(tmp_path, clock)
    history(store, clock, 15)
    predictions = LivePredictions(store, PredictionOptions(min_history=20))
    short, _ = store.submit_job("a", spec("short"), "u")  # type: ignore[arg-type]
    long, _ = store.submit_job("b", spec("long"), "u")  # type: ignore[arg-type]
    asked, _ = store.submit_job("a", spec("short", 5.0), "u")  # type: ignore[arg-type]
    short_job = predictions.job(short, clock.now())
    assert short_job.duration_estimate is not None and 40 < short_job.duration_estimate < 90
    long_estimate = predictions.job(long, clock.now()).duration_estimate
    assert long_estimate is not None and 400 < long_estimate < 900
    assert predictions.job(asked, clock.now()).duration_estimate == 5.0  # the user's
    assert predictions.predicted[short.id].source == "model"
    assert predictions.predicted[short.id].trained_on == 30
    store.close()


def test_the_loop_queues_jobs_with_predictions_and_without_history_as_submitted(
    tmp_path: Path,
) -> None:
    clock = ManualClock(1_700_000_000.0)
    store = open_store(tmp_path, clock)
    store.upsert_nodes([Node("node-0", 1, "H100", "rack-0", "pod-0")])
    blocker, _ = store.submit_job("a", spec("blocker", 1e6), "u")  # type: ignore[arg-type]
    options = PredictionOptions(retrain_interval_s=3600, min_history=20)
    settings = LoopSettings(SchedulerConfig(queue="sjf"), prediction=options)
    loop = ControlLoop(store, None, None, clock, settings)
    loop.tick()  # the blocker holds the only GPU
    early, _ = store.submit_job("a", spec("short"), "u")  # type: ignore[arg-type]
    loop.tick()
    assert loop.state is not None
    assert loop.state.pending[early.id].job.duration_estimate is None  # no history: says so
    assert loop.intake.predictions is not None
    assert loop.intake.predictions.predicted[early.id].source == "none"
    history(store, clock, 15)
    clock.advance(3600)  # the retraining is due
    later, _ = store.submit_job("a", spec("short"), "u")  # type: ignore[arg-type]
    loop.tick()
    estimate = loop.state.pending[later.id].job.duration_estimate
    assert estimate is not None and 40 < estimate < 90
    assert blocker.id in loop.state.running
    store.close()


def test_the_job_shows_its_prediction_and_says_when_there_is_no_history(tmp_path: Path) -> None:
    """A server whose loop follows the applied configuration: with predictions on, a queued
    job's GET /v1/jobs/{id} shows what it was told (here: no history yet)."""
    plane = open_live_plane(tmp_path, [Tenant("a")], racks(1, 1, 1), follow_config=True)
    tokens = users(plane.store, {"alice": ("a", Role.VIEWER)})
    plane.store.apply_config("policy: {name: sjf}\nprediction: {enabled: true}\n", "c", "t")
    with leading(plane), serve(plane) as url:
        job_id = submit(plane.store, "a", "too-big", workers=2, gpus=8)  # never fits: waits
        server = RunningServer(url, plane, tokens)
        with server.client("alice") as alice:
            wait_for(
                lambda: alice.get(f"/v1/jobs/{job_id}").json()["predicted_duration"], "a prediction"
            )
            shown = alice.get(f"/v1/jobs/{job_id}").json()["predicted_duration"]
    assert shown == {"quantiles": {}, "source": "none", "trained_on": 0}
    plane.store.close()


def test_a_prediction_is_recorded_once_and_exported_for_the_replay(tmp_path: Path) -> None:
    """The live prediction, as it was when the job was first taken in, is a ``job.predicted``
    event; taken in again (a requeue) the job keeps it; ``twin export`` writes it as the trace's
    ``predicted_duration``, which a replay with predictions on reads instead of predicting."""
    clock = ManualClock(1_700_000_000.0)
    store = open_store(tmp_path, clock)
    history(store, clock, 15)
    predictions = LivePredictions(store, PredictionOptions(min_history=20))
    job, _ = store.submit_job("a", spec("short"), "u")  # type: ignore[arg-type]
    first = predictions.job(job, clock.now()).duration_estimate
    clock.advance(10_000.0)
    history(store, clock, 15)  # more history, a model retrained later: the job keeps its own
    assert predictions.job(job, clock.now()).duration_estimate == first
    recorded = [e for e in store.events(job.id) if e.kind == "job.predicted"]
    assert len(recorded) == 1 and recorded[0].details["estimate"] == first
    exported = twin_job(store, job)
    assert exported.predicted_duration == first
    row = next(csv.DictReader(io.StringIO(trace_text([_ran(exported)], 0.0))))
    trace = load_csv_text(tmp_path, row)
    assert trace.predicted_duration == pytest.approx(first, abs=1e-3)  # (the CSV keeps ms)
    predictor = PredictionOptions(min_history=20).predictor()
    assert predictor.submitted(trace, 0.0) == trace.predicted_duration  # not predicted again
    store.close()


def _ran(job: TwinJob) -> TwinJob:
    return replace(job, runs=(Run(0.0, 60.0, False),), outcome="SUCCEEDED")


def load_csv_text(tmp_path: Path, row: dict[str, str]) -> TraceJob:
    path = tmp_path / "trace.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    (loaded,) = load_csv(path)
    return loaded
