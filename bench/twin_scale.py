"""A digital twin at scale: a synthetic cluster of up to 220,000 GPUs for 30 simulated days.

    .venv/bin/python bench/twin_scale.py [--gpus 220000] [--policy fifo] [--load 0.9] [--days 30]
    .venv/bin/python bench/twin_scale.py --sweep [--sizes 10000,50000,100000,220000]
                                         [--policies fifo,tiresias,fair]

Nodes of 8 GPUs; Poisson arrivals sized so that the GPU-time they offer within the simulated days
is ``--load`` of the cluster's (90% by default, so jobs wait: a job that arrives near the end
offers only the part of its run before it, so the rate is higher than ``synthetic_jobs``' own
sizing by the whole run, by 9% at 30 days); Philly's GPU-count mix scaled ×8 (a 1-GPU Philly job
becomes an 8-GPU job, 128 GPUs become 1,024) and its lognormal durations; node failures at Llama
3's rate; the scheduler at its defaults (preemption on: Tiresias preempts by its own right, fair
and fifo only by priority or reclaim, which this one-priority, quota-free workload never asks for).

Prints bench/calibration.py's interpreter figure (measured before and after the run), wall and
CPU time, peak RSS, jobs, events, utilization and waits. ``--sweep`` runs every size under every
policy, each in its own process (so each peak RSS is that run's alone), one after another, and
prints one table. Figures only: nothing here asserts a time (see docs/benchmarks.md for recorded
ones).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

from aicluster.core import make_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, SyntheticMix, summarize, synthetic_jobs
from calibration import build, interpreter_ms

_DAY = 86_400.0
_SIZES = "10000,50000,100000,220000"
_POLICIES = "fifo,tiresias,fair"


def _load_average() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def mean_within(mix: SyntheticMix, horizon: float, steps: int = 20_000) -> float:
    """Mean seconds of a job's run that fall before ``horizon`` when it arrives at a uniform
    time in [0, ``horizon``): E[min(X, U)] = E[X - X²/2H] below H, H/2 above, by the
    trapezoid rule over the lognormal's standard-normal variable (±9 σ)."""
    mu, total, weights = math.log(mix.median_duration), 0.0, 0.0
    for k in range(steps + 1):
        z = -9.0 + 18.0 * k / steps
        weight = math.exp(-z * z / 2) * (0.5 if k in (0, steps) else 1.0)
        x = min(max(1.0, math.exp(mu + mix.sigma * z)), mix.max_duration)
        total += weight * (x - x * x / (2 * horizon) if x < horizon else horizon / 2)
        weights += weight
    return total / weights


_SUMMARY = (
    "jobs",
    "completed",
    "events",
    "cycles",
    "preemptions",
    "failures",
    "failure_interruptions",
    "lost_gpu_hours_failures",
    "utilization",
    "queue_delay_mean",
    "queue_delay_p95",
    "jct_mean",
    "goodput",
    "energy_kwh",
)


class _WallLimit(Exception):
    """Raised from the progress callback to stop a run at ``--wall-limit``."""

    def __init__(self, now: float, arrived: int) -> None:
        super().__init__(f"stopped at day {now / _DAY:.1f}")
        self.now, self.arrived = now, arrived


def run(args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """One run; its figures (``log`` gets progress lines every 30 s of wall time)."""
    calibration = interpreter_ms()  # first, so that it adds nothing to the run's figures
    load_before = _load_average()
    started = time.perf_counter()
    cpu = time.process_time()
    nodes = args.gpus // args.gpus_per_node
    cluster = make_cluster(nodes=nodes, gpus_per_node=args.gpus_per_node)
    horizon = args.days * _DAY
    mix = SyntheticMix(gpu_scale=args.gpu_scale)
    jobs = synthetic_jobs(
        random.Random(f"trace:{args.seed}"),
        total_gpus=cluster.total_gpus,
        load=args.load * mix.mean_duration() / mean_within(mix, horizon),
        horizon=horizon,
        mix=mix,
    )
    config = SimConfig(cycle_interval=args.cycle_interval, until=horizon, seed=args.seed)
    last = [time.perf_counter()]

    def progress(now: float, arrived: int, done: int) -> None:
        if args.wall_limit and time.perf_counter() - started >= args.wall_limit:
            raise _WallLimit(now, arrived)
        if time.perf_counter() - last[0] >= 30:
            last[0] = time.perf_counter()
            elapsed = last[0] - started
            print(
                f"  {elapsed:6.0f} s: day {now / _DAY:5.1f}, {arrived:,} jobs", file=log, flush=True
            )

    scheduler = SchedulerConfig(queue=args.policy, preemption=not args.no_preemption)
    simulator = Simulator(cluster, jobs, scheduler=scheduler, config=config)
    stopped: _WallLimit | None = None
    try:
        summary = summarize(simulator.run(progress))
    except _WallLimit as limit:  # the figures so far: no summary of a run cut short
        stopped, summary = limit, dict.fromkeys(_SUMMARY)
        summary["jobs"] = limit.arrived
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    # Again after the run: a shared host's speed moves within minutes (110 to 350 ms in one
    # session), so the figure before alone can mislead.
    calibration_after = interpreter_ms()
    return {
        "stopped_at_day": None if stopped is None else stopped.now / _DAY,
        "gpus": cluster.total_gpus,
        "nodes": nodes,
        "policy": args.policy,
        "preemption": scheduler.preemption,
        "load": args.load,
        "days": args.days,
        "build": build(),
        "interpreter_ms": calibration,
        "interpreter_ms_after": calibration_after,
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB
        "load_average_before": load_before,
        "load_average_after": _load_average(),
        "queued_at_end": len(simulator.state.pending),
        **{key: summary[key] for key in _SUMMARY},
    }


def report(figures: dict[str, Any]) -> None:
    f = figures
    print(
        f"{f['gpus']:,} GPUs on {f['nodes']:,} nodes, {f['days']:g} days, {f['policy']} "
        f"(preemption {'on' if f['preemption'] else 'off'}), offered load {f['load']:.0%}; "
        f"{f['build']}, interpreter speed {f['interpreter_ms']:.0f} ms before the run, "
        f"{f['interpreter_ms_after']:.0f} ms after (bench/calibration.py)"
    )
    print(
        f"wall {f['wall_s']:.0f} s, cpu {f['cpu_s']:.0f} s, peak RSS {f['peak_rss_gib']:.2f} GiB, "
        f"load average {f['load_average_before']} before, {f['load_average_after']} after"
    )
    if f["stopped_at_day"] is not None:
        print(
            f"stopped at the wall limit ({f['wall_s']:.0f} s) at simulated day "
            f"{f['stopped_at_day']:.1f} of {f['days']:g}, {f['jobs']:,} jobs arrived"
        )
        return
    print(
        f"jobs simulated {f['jobs']:,} (completed {f['completed']:,}, queued at the end "
        f"{f['queued_at_end']:,}), preemptions {f['preemptions']:,}, failures {f['failures']:,} "
        f"interrupting {f['failure_interruptions']:,} jobs, lost "
        f"{f['lost_gpu_hours_failures']:,.0f} GPU-hours"
    )
    print(
        f"utilization {f['utilization']:.1%}, wait mean {f['queue_delay_mean'] / 3600:.2f} h, "
        f"p95 {f['queue_delay_p95'] / 3600:.2f} h, mean JCT {f['jct_mean'] / 3600:.2f} h, "
        f"goodput {f['goodput']:.2%}, energy {f['energy_kwh'] / 1000:,.0f} MWh"
    )
    print(f"cycles {f['cycles']:,}, events {f['events']:,}, {f['jobs'] / f['wall_s']:,.0f} jobs/s")


_COLUMNS = (
    ("policy", "policy", "{}"),
    ("GPUs", "gpus", "{:,}"),
    ("stopped at day", "stopped_at_day", "{:.1f}"),
    ("jobs", "jobs", "{:,}"),
    ("events", "events", "{:,}"),
    ("preempt", "preemptions", "{:,}"),
    ("util", "utilization", "{:.1%}"),
    ("wait h", "queue_delay_mean", "{:.2f}"),
    ("p95 h", "queue_delay_p95", "{:.2f}"),
    ("wall s", "wall_s", "{:.0f}"),
    ("CPU s", "cpu_s", "{:.0f}"),
    ("RSS GiB", "peak_rss_gib", "{:.2f}"),
    ("interp ms before", "interpreter_ms", "{:.0f}"),
    ("after", "interpreter_ms_after", "{:.0f}"),
    ("load avg after", "load_average_after", "{}"),
)


def _cell(key: str, fmt: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.startswith("queue_delay"):
        value = value / 3600
    return fmt.format(value)


def sweep(args: argparse.Namespace) -> None:
    """Each size under each policy in its own process, smallest first; one table at the end."""
    rows: list[dict[str, Any]] = []
    passed = ["--days", str(args.days), "--load", str(args.load), "--seed", str(args.seed)]
    passed += ["--cycle-interval", str(args.cycle_interval), "--gpu-scale", str(args.gpu_scale)]
    passed += ["--gpus-per-node", str(args.gpus_per_node)]
    passed += ["--no-preemption"] if args.no_preemption else []
    passed += ["--wall-limit", str(args.wall_limit)]
    for gpus in (int(size) for size in args.sizes.split(",")):
        for policy in args.policies.split(","):
            command = [sys.executable, __file__, "--json", "--gpus", str(gpus), "--policy", policy]
            print(f"{policy} at {gpus:,} GPUs ...", file=sys.stderr, flush=True)
            done = subprocess.run(
                [*command, *passed], stdout=subprocess.PIPE, check=True, text=True
            )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            report(rows[-1])
    print()
    print("| " + " | ".join(title for title, _, _ in _COLUMNS) + " |")
    print("|" + "---|" * len(_COLUMNS))
    for row in rows:
        print("| " + " | ".join(_cell(key, fmt, row[key]) for _, key, fmt in _COLUMNS) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=220_000, help="rounded down to whole nodes")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--load", type=float, default=0.9, help="offered GPU-time / capacity")
    parser.add_argument("--gpu-scale", type=int, default=8)
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--no-preemption", action="store_true")
    parser.add_argument("--cycle-interval", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep", action="store_true", help="every size under every policy")
    parser.add_argument("--sizes", default=_SIZES, help="GPU counts of --sweep")
    parser.add_argument("--policies", default=_POLICIES, help="policies of --sweep")
    parser.add_argument(
        "--wall-limit", type=float, default=0.0, help="stop a run after this many seconds (0: none)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    args = parser.parse_args()
    if args.sweep:
        sweep(args)
        return
    figures = run(args, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(figures))
    else:
        report(figures)


if __name__ == "__main__":
    main()
