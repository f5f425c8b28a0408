"""Predicted run times on Philly: train on the first 60% of the trace by submission, test on
the rest; the median absolute error of the prediction, and the mean JCT of sjf with predictions
against sjf with the oracle (true run times) and fifo, replaying the test part. Then estimated
starts: during replays of the test part (fifo and sjf, both on predictions), a forecast every
``--forecast-every-h`` simulated hours, as the live loop makes (``sim/forecast.py``: the first
1,000 queued jobs in queue order, a 7-day horizon), each job's estimate against the start the
replay then gave it.

    nice -n 10 .venv/bin/python bench/predict_durations.py [--limit N] [--cluster FILE]

The predictor (aicluster.sim.predict) sees what Philly has: the tenant (virtual cluster) and the
GPU count; no user, name or requested time. The replays run without failures, so the policies
alone differ. Baseline beside the model: each tenant's median run time in the training part.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from aicluster.control.views.queueview import queue_order
from aicluster.core import Cluster, parse_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, TraceJob, load_philly, summarize
from aicluster.sim.forecast import ForecastOptions, estimate_starts
from aicluster.sim.predict import DurationPredictor, OnlinePredictor, sample_of
from calibration import interpreter_ms

ROOT = Path(__file__).resolve().parents[1]


def split(jobs: list[TraceJob], share: float) -> tuple[list[TraceJob], list[TraceJob]]:
    """The first ``share`` of ``jobs`` by submission, and the rest from t=0."""
    ordered = sorted(jobs, key=lambda job: job.submit_time)
    cut = int(len(ordered) * share)
    train, test = ordered[:cut], ordered[cut:]
    origin = test[0].submit_time if test else 0.0
    return train, [replace(job, submit_time=job.submit_time - origin) for job in test]


def errors(train: list[TraceJob], test: list[TraceJob]) -> dict[str, float]:
    samples = [replace(sample_of(job), duration=job.duration) for job in train]
    model = DurationPredictor(quantiles=(0.5, 0.9))
    started = time.perf_counter()
    model.fit(samples)
    fit_s = time.perf_counter() - started
    predicted = model.predict_many([sample_of(job) for job in test])
    truth = [job.duration for job in test]
    by_tenant: dict[str, list[float]] = {}
    for job in train:
        by_tenant.setdefault(job.tenant, []).append(job.duration)
    overall = statistics.median(job.duration for job in train)
    medians = {tenant: statistics.median(values) for tenant, values in by_tenant.items()}
    baseline = [medians.get(job.tenant, overall) for job in test]
    p50 = [p.quantiles[0.5] for p in predicted]
    covered = sum(t <= p.quantiles[0.9] for t, p in zip(truth, predicted, strict=True))
    return {
        "fit_s": fit_s,
        "model_median_abs_error_s": statistics.median(
            abs(p - t) for p, t in zip(p50, truth, strict=True)
        ),
        "baseline_median_abs_error_s": statistics.median(
            abs(b - t) for b, t in zip(baseline, truth, strict=True)
        ),
        "p90_coverage": covered / len(test),
    }


def mean_jct(cluster_file: Path, train: list[TraceJob], test: list[TraceJob]) -> dict[str, float]:
    cluster = parse_cluster(cluster_file.read_text(), str(cluster_file))
    config = SimConfig(failures=False)
    found = {}
    for label, policy, predicted in (
        ("fifo", "fifo", False),
        ("sjf_oracle", "sjf", False),
        ("sjf_predicted", "sjf", True),
    ):
        predictor = _online(train, test) if predicted else None
        scheduler = SchedulerConfig(queue=policy)
        simulator = Simulator(
            cluster, test, scheduler=scheduler, config=config, predictor=predictor
        )
        summary = summarize(simulator.run())
        found[label] = summary["jct_mean"] / 3600
        print(f"  {label:>14}: mean JCT {found[label]:.2f} h", flush=True)
    return found


def _online(train: list[TraceJob], test: list[TraceJob]) -> OnlinePredictor:
    predictor = OnlinePredictor(min_history=1)
    predictor.history = [replace(sample_of(job), duration=job.duration) for job in train]
    predictor.predict_ahead(test)
    return predictor


def start_errors(
    cluster: Cluster,
    train: list[TraceJob],
    test: list[TraceJob],
    policy: str,
    every_s: float,
    oracle: bool = False,
) -> dict[str, float]:
    """Replay ``test`` under ``policy`` on predictions (``oracle``: on the true run times, the
    check that the forecast is the scheduler's), forecasting every ``every_s`` simulated seconds
    (at the first progress point after each); each forecast's estimates against the starts the
    replay gave (estimates beyond the horizon counted apart)."""
    options = ForecastOptions()
    if oracle:
        test = [replace(job, duration_estimate=job.duration) for job in test]
    simulator = Simulator(
        cluster,
        test,
        scheduler=SchedulerConfig(queue=policy),
        config=SimConfig(failures=False),
        predictor=None if oracle else _online(train, test),
    )
    forecasts: list[tuple[float, dict[str, float | None]]] = []
    due = every_s

    def forecast(now: float, _arrived: int, _done: int) -> None:
        nonlocal due
        if now < due:
            return
        due = now + every_s
        state = simulator.state
        queued = queue_order(state, now)[: options.max_jobs]
        if queued:
            forecasts.append((now, estimate_starts(state, now, queued, options.horizon_s)))

    simulator.run(progress=forecast)
    starts = dict(zip(simulator.table.ids, simulator.table.start, strict=True))
    errors, waits, beyond, first, seen = [], [], 0, [], set()
    for at, estimates in forecasts:
        for job_id, estimate in estimates.items():
            if estimate is None:
                beyond += 1
                continue
            error = abs(estimate - starts[job_id])
            errors.append(error)
            waits.append(starts[job_id] - at)
            if job_id not in seen:
                seen.add(job_id)
                first.append(error)
    pairs = len(errors) + beyond
    return {
        "forecasts": len(forecasts),
        "estimates": pairs,
        "median_abs_error_h": _hours(statistics.median, errors),
        "p90_abs_error_h": _hours(lambda values: statistics.quantiles(values, n=10)[-1], errors),
        "first_estimate_median_abs_error_h": _hours(statistics.median, first),
        "median_wait_left_h": _hours(statistics.median, waits),  # from the forecast to the start
        "beyond_horizon_share": beyond / pairs if pairs else 0.0,
    }


def _hours(figure: Callable[[list[float]], float], seconds: list[float]) -> float:
    return figure(seconds) / 3600 if len(seconds) > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N jobs")
    parser.add_argument("--cluster", type=Path, default=ROOT / "examples/clusters/philly-512.yaml")
    parser.add_argument(
        "--forecast-every-h", type=float, default=24.0, help="0: no estimated starts"
    )
    args = parser.parse_args()
    jobs = load_philly()[: args.limit]
    train, test = split(jobs, 0.6)
    print(
        f"Philly: {len(train):,} jobs to train, {len(test):,} to test; interpreter speed "
        f"{interpreter_ms():.0f} ms (bench/calibration.py: lower is faster)",
        flush=True,
    )
    for key, value in errors(train, test).items():
        print(f"  {key}: {value:.3f}", flush=True)
    mean_jct(args.cluster, train, test)
    if args.forecast_every_h > 0:
        cluster = parse_cluster(args.cluster.read_text(), str(args.cluster))
        for policy in ("fifo", "sjf"):
            for oracle in (False, True):
                every_s = args.forecast_every_h * 3600
                found = start_errors(cluster, train, test, policy, every_s, oracle)
                figures = ", ".join(f"{key} {value:.3f}" for key, value in found.items())
                basis = "true run times" if oracle else "predictions"
                print(f"  estimated starts, {policy} on {basis}: {figures}", flush=True)


if __name__ == "__main__":
    main()
