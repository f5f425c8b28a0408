"""Replay the full Philly trace (82,247 jobs) on 512 GPUs under each policy and print figures.

    .venv/bin/python bench/sim_replay.py [--policies fifo,sjf,tiresias,fair] [--limit N]
    make compiled && PYTHONPATH=.build/compiled .venv/bin/python bench/sim_replay.py  # mypyc build

``--cpus-per-gpu`` and ``--memory-per-gpu`` give every job CPUs and memory in proportion to its
GPUs (Philly has none), so that the replay places them too.

Prints, per policy: wall and CPU seconds, jobs per second, events, scheduling cycles and the mean
JCT; then the peak RSS and the load average (the machine is shared: CPU seconds are the figure).
Figures only: nothing here asserts a time (see docs/benchmarks.md for recorded ones).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time
from pathlib import Path

from aicluster.core import parse_cluster
from aicluster.sim import SimConfig, simulate, summarize
from calibration import build, interpreter_ms
from instructions import counted
from philly_jobs import add_host_options, philly_jobs

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fifo,sjf,tiresias,fair")
    parser.add_argument("--cluster", default=str(ROOT / "examples/clusters/philly-512.yaml"))
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    parser.add_argument("--cycle-interval", type=float, default=0.0)
    parser.add_argument("--no-failures", action="store_true")
    add_host_options(parser)
    args = parser.parse_args()
    cluster_path = Path(args.cluster)
    cluster = parse_cluster(cluster_path.read_text(), str(cluster_path))
    started = time.perf_counter()
    jobs = philly_jobs(args.limit, args)
    print(f"loaded {len(jobs):,} jobs in {time.perf_counter() - started:.1f} s")
    print(
        f"cluster {cluster.name}: {cluster.total_gpus} GPUs; python {platform.python_version()}; "
        f"interpreter speed {interpreter_ms():.0f} ms (bench/calibration.py: lower is faster); "
        f"scheduler {build()}"
    )
    config = SimConfig(failures=not args.no_failures, cycle_interval=args.cycle_interval)
    header = f"{'policy':<10}{'wall s':>8}{'cpu s':>8}{'jobs/s':>9}{'events':>9}{'cycles':>9}"
    print(header + f"{'mean JCT h':>12}{'util':>7}{'preempt':>9}")
    for policy in args.policies.split(","):
        cpu = time.process_time()
        with counted(f"{policy} replay"):
            result = simulate(cluster, jobs, policy, config=config)
        cpu = time.process_time() - cpu
        summary = summarize(result)
        print(
            f"{policy:<10}{summary['wall_seconds']:>8.1f}{cpu:>8.2f}"
            f"{summary['jobs_per_second']:>9,.0f}{summary['events']:>9,}{summary['cycles']:>9,}"
            f"{summary['jct_mean'] / 3600:>12.2f}{summary['utilization']:>7.1%}"
            f"{summary['preemptions']:>9,}",
            flush=True,
        )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"peak RSS {peak_mib:.0f} MiB; load average now {load}")


if __name__ == "__main__":
    main()
