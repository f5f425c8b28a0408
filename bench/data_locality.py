"""What data locality saves: a synthetic trace whose jobs read datasets, replayed with and
without the ``data_cached_bytes`` placement term.

    nice -n 10 .venv/bin/python bench/data_locality.py [--days 2] [--datasets 40] [--cache-gb 200]
        [--policy fifo] [--cluster examples/clusters/philly-512.yaml]

The trace is ``aicluster.sim.synthetic_jobs`` (seeded) at 70% load; each job reads one of
``--datasets`` datasets, drawn by a Zipf law (a few popular ones), of sizes drawn log-normally
(median 100 GB, at most 2 TB). Each node caches ``--cache-gb`` (LRU); a job waits for the bytes
its nodes lack, fetched over the rack's or pod's link from a node that holds them, else from
the store over the cluster's link (the cluster file's ``bandwidth:``; ``docs/simulator.md``,
"Data"). Prints mean and median JCT, the data moved and the hours jobs spent waiting for it
(summed over jobs); the figures are simulated (the machine changes only the CPU seconds).
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace
from itertools import accumulate
from pathlib import Path

from aicluster.core import parse_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, TraceJob, simulate, summarize, synthetic_jobs

ROOT = Path(__file__).resolve().parents[1]


def trace(total_gpus: int, days: float, datasets: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    sizes = [min(2000.0, rng.lognormvariate(4.6, 1.0)) for _ in range(datasets)]  # GB
    popularity = list(accumulate(1 / (rank + 1) for rank in range(datasets)))
    jobs = []
    for job in synthetic_jobs(rng, total_gpus=total_gpus, horizon=days * 86400):
        pick = rng.choices(range(datasets), cum_weights=popularity)[0]
        jobs.append(replace(job, dataset=f"ds-{pick}", data_gb=round(sizes[pick], 1)))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", type=Path, default=ROOT / "examples/clusters/philly-512.yaml")
    parser.add_argument("--days", type=float, default=2.0)
    parser.add_argument("--datasets", type=int, default=40)
    parser.add_argument("--cache-gb", type=float, default=200.0)
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cluster = parse_cluster(args.cluster.read_text(), str(args.cluster))
    jobs = trace(cluster.total_gpus, args.days, args.datasets, args.seed)
    config = SimConfig(failures=False, data_cache_bytes=int(args.cache_gb * 1e9))
    print(
        f"{len(jobs):,} synthetic jobs over {args.days:g} days reading {args.datasets} datasets "
        f"({sum(j.data_gb for j in jobs) / 1e3:,.0f} TB read in all) on {cluster.name} "
        f"({cluster.total_gpus} GPUs), node cache {args.cache_gb:g} GB, policy {args.policy}, "
        f"bandwidths {cluster.bandwidth}",
        flush=True,
    )
    print(
        f"{'locality':<8} {'jct mean s':>12} {'jct median s':>13} {'TB moved':>9} "
        f"{'wait h':>11} {'cpu s':>7}"
    )
    for label, terms in (("off", ()), ("on", ("data_cached_bytes",))):
        scheduler = SchedulerConfig(queue=args.policy, placement_preferences=terms)
        cpu = time.process_time()
        result = simulate(cluster, jobs, scheduler=scheduler, config=config)
        cpu = time.process_time() - cpu
        summary = summarize(result)
        print(
            f"{label:<8} {summary['jct_mean']:>12,.0f} {summary['jct_median']:>13,.0f} "
            f"{summary['data_gb_moved'] / 1e3:>9,.1f} {summary['data_wait_hours']:>11,.1f} "
            f"{cpu:>7.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
