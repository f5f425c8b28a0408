"""Predicted run times on Philly: train on the first 60% of the trace by submission, test on
the rest; the median absolute error of the prediction, and the mean JCT of sjf with predictions
against sjf with the oracle (true run times) and fifo, replaying the test part.

    nice -n 10 .venv/bin/python bench/predict_durations.py [--limit N] [--cluster FILE]

The predictor (aicluster.sim.predict) sees what Philly has: the tenant (virtual cluster) and the
GPU count; no user, name or requested time. The replays run without failures, so the policies
alone differ. Baseline beside the model: each tenant's median run time in the training part.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

from aicluster.core import parse_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, TraceJob, load_philly, summarize
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
        predictor = None
        if predicted:
            predictor = OnlinePredictor(min_history=1)
            predictor.history = [replace(sample_of(job), duration=job.duration) for job in train]
            predictor.predict_ahead(test)
        scheduler = SchedulerConfig(queue=policy)
        simulator = Simulator(
            cluster, test, scheduler=scheduler, config=config, predictor=predictor
        )
        summary = summarize(simulator.run())
        found[label] = summary["jct_mean"] / 3600
        print(f"  {label:>14}: mean JCT {found[label]:.2f} h", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N jobs")
    parser.add_argument("--cluster", type=Path, default=ROOT / "examples/clusters/philly-512.yaml")
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


if __name__ == "__main__":
    main()
