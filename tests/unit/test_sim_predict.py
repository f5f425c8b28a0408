"""Predicted run times (aicluster.sim.predict): what the model learns, what it says without
history, and that a replay's sjf orders by the prediction, as the cluster could have known it."""

from __future__ import annotations

import csv
import random
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import make_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, TraceJob
from aicluster.sim.predict import DurationPredictor, OnlinePredictor, Sample


def history(count: int, seed: int = 0) -> list[Sample]:
    """Tenant a's jobs run about 100 s, tenant b's about 1000 s (±20%)."""
    draw = random.Random(seed)
    return [
        Sample(tenant, user=f"{tenant}-user", gpus=1, duration=base * draw.uniform(0.8, 1.2))
        for tenant, base in (("a", 100.0), ("b", 1000.0))
        for _ in range(count // 2)
    ]


def test_the_model_learns_each_tenants_run_times_with_ordered_quantiles() -> None:
    model = DurationPredictor(quantiles=(0.5, 0.9))
    assert model.fit(history(200))
    a, b = model.predict_many([Sample("a", user="a-user"), Sample("b", user="b-user")])
    assert a.source == b.source == "model" and a.trained_on == 200
    assert 70 < a.quantiles[0.5] < 130 and 700 < b.quantiles[0.5] < 1300
    assert a.quantiles[0.9] >= a.quantiles[0.5] and b.quantiles[0.9] >= b.quantiles[0.5]


def test_without_history_it_says_so_and_falls_back_to_the_request() -> None:
    model = DurationPredictor(min_history=20)
    assert not model.fit(history(10))
    assert model.predict(Sample("a")).source == "none"
    assert model.predict(Sample("a")).estimate is None
    asked = model.predict(Sample("a", requested=300.0))
    assert (asked.source, asked.estimate) == ("request", 300.0)


def test_online_retraining_sees_only_jobs_finished_before_it() -> None:
    online = OnlinePredictor(interval_s=100.0, min_history=5)
    job = TraceJob("j", 0.0, 50.0, 1, tenant="a")
    assert online.submitted(job, 0.0) is None and online.fits == 1  # nothing finished yet
    for i in range(6):
        online.submitted(replace(job, id=f"h{i}"), 1.0)
        online.ended(f"h{i}", 50.0)
    assert online.submitted(replace(job, id="k"), 50.0) is None  # not retrained before t=100
    predicted = online.submitted(replace(job, id="m"), 100.0)
    assert online.fits == 2 and online.model.trained_on == 6 and predicted is not None
    assert online.submitted(replace(job, id="n", duration_estimate=7.0), 101.0) == 7.0


def test_a_replays_sjf_orders_by_the_prediction_not_the_truth() -> None:
    """One GPU; a blocker runs first; then tenant b's job (predicted 1000 s, truly 10 s) and
    tenant a's (predicted 100 s, truly 500 s) wait. The oracle starts b's first; the prediction
    starts a's first."""
    trace = [
        TraceJob("blocker", 0.0, 60.0, 1, tenant="a"),
        TraceJob("b-job", 1.0, 10.0, 1, tenant="b"),
        TraceJob("a-job", 2.0, 500.0, 1, tenant="a"),
    ]
    cluster = make_cluster(nodes=1, gpus_per_node=1)
    config = SimConfig(failures=False)
    starts = {}
    for label in ("oracle", "predicted"):
        predictor = None
        if label == "predicted":
            predictor = OnlinePredictor(min_history=1)
            predictor.history = history(100)
            predictor.predict_ahead(trace)
        result = Simulator(
            cluster, trace, scheduler=SchedulerConfig(queue="sjf"), config=config,
            predictor=predictor,
        ).run()  # fmt: skip
        starts[label] = dict(zip(result.jobs.ids, result.jobs.start, strict=True))
    assert starts["oracle"]["b-job"] < starts["oracle"]["a-job"]
    assert starts["predicted"]["a-job"] < starts["predicted"]["b-job"]


def test_aicluster_sim_predicts_where_the_configuration_says_so(tmp_path: Path) -> None:
    """``prediction.enabled`` in the file: the replay runs sjf on predictions (here, until the
    history is long enough, on none: every job waits in submission order)."""
    trace = tmp_path / "trace.csv"
    rows = "".join(f"{i},{100 - i * 10},1,{'ab'[i % 2]}\n" for i in range(6))
    trace.write_text("submit_time,duration,num_gpus,tenant\n" + rows)
    config = tmp_path / "config.yaml"
    config.write_text("policy: {name: sjf}\nprediction: {enabled: true, min_history: 50}\n")
    out = tmp_path / "sim"
    options = ["--trace", str(trace), "--config", str(config), "--nodes", "1", "--gpus-per-node"]
    done = CliRunner().invoke(app, ["sim", *options, "1", "--out", str(out), "--no-report"])
    assert done.exit_code == 0, done.output
    with (out / "jobs-sjf.csv").open() as handle:
        starts = {row["id"]: float(row["start_time"]) for row in csv.DictReader(handle)}
    assert sorted(starts, key=starts.__getitem__) == [f"job-{i}" for i in range(1, 7)]
