"""A digital twin at scale: a synthetic 100,000-GPU cluster for 30 simulated days, with failures.

    .venv/bin/python bench/twin_scale.py [--days 30] [--nodes 12500] [--policy fifo]

12,500 nodes × 8 GPUs; Poisson arrivals offering 75% load; Philly's GPU-count mix scaled ×8 (a
1-GPU Philly job becomes an 8-GPU job, 128 GPUs become 1,024) and its lognormal durations; node
failures at Llama 3's rate. Prints wall and CPU time, peak RSS, jobs simulated and failures.
Figures only: nothing here asserts a time (see docs/benchmarks.md for recorded ones).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import time

from aicluster.core import make_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, Simulator, SyntheticMix, summarize, synthetic_jobs

_DAY = 86_400.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--load", type=float, default=0.75)
    parser.add_argument("--gpu-scale", type=int, default=8)
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--cycle-interval", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    cpu = time.process_time()
    cluster = make_cluster(nodes=args.nodes, gpus_per_node=args.gpus_per_node)
    horizon = args.days * _DAY
    jobs = synthetic_jobs(
        random.Random(f"trace:{args.seed}"),
        total_gpus=cluster.total_gpus,
        load=args.load,
        horizon=horizon,
        mix=SyntheticMix(gpu_scale=args.gpu_scale),
    )
    config = SimConfig(cycle_interval=args.cycle_interval, until=horizon, seed=args.seed)
    last = [time.perf_counter()]

    def progress(now: float, arrived: int, done: int) -> None:
        if time.perf_counter() - last[0] >= 30:
            last[0] = time.perf_counter()
            elapsed = last[0] - started
            print(f"  {elapsed:6.0f} s: day {now / _DAY:5.1f}, {arrived:,} jobs", flush=True)

    print(f"{cluster.total_gpus:,} GPUs on {args.nodes:,} nodes, {args.days:g} days, {args.policy}")
    scheduler = SchedulerConfig(queue=args.policy)
    simulator = Simulator(cluster, jobs, scheduler=scheduler, config=config)
    summary = summarize(simulator.run(progress))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"wall {wall:.0f} s, cpu {cpu:.0f} s, peak RSS {peak_gib:.2f} GiB, load average {load}")
    print(
        f"jobs simulated {summary['jobs']:,} (completed {summary['completed']:,}), "
        f"failures {summary['failures']:,} interrupting {summary['failure_interruptions']:,} "
        f"jobs, lost {summary['lost_gpu_hours_failures']:,.0f} GPU-hours"
    )
    print(
        f"utilization {summary['utilization']:.1%}, mean JCT {summary['jct_mean'] / 3600:.2f} h, "
        f"mean wait {summary['queue_delay_mean'] / 3600:.2f} h, goodput {summary['goodput']:.2%}, "
        f"energy {summary['energy_kwh'] / 1000:,.0f} MWh"
    )
    print(
        f"cycles {summary['cycles']:,}, events {summary['events']:,}, "
        f"{summary['jobs'] / wall:,.0f} jobs/s"
    )


if __name__ == "__main__":
    main()
