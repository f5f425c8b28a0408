"""Hash every decision of a Philly replay, to compare two versions of the code decision by decision.

    nice -n 10 .venv/bin/python bench/sim_digest.py [--policies fifo,sjf,tiresias,fair] [--limit N]
    .venv/bin/python bench/sim_digest.py --config examples/config/plain.yaml  # no shortcuts
    .venv/bin/python bench/sim_digest.py --cpus-per-gpu 4 --memory-per-gpu 32  # host placement

Run it once per source tree (``PYTHONPATH=<other checkout>/src`` for the other), side by side, so
the machine's load affects both alike. Per policy it prints the CPU seconds of the replay and a
SHA-256 over the summary (minus wall-clock figures) and every job's start, end and restart count,
as ``tests/unit/test_sim_replay_golden.py`` does; equal hashes mean identical decisions.
``--config FILE`` runs the scheduler with that configuration file's settings (its policy
replaced by each of ``--policies``), e.g. without the shortcut layer.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path

import aicluster
from aicluster.configuration import parse_configuration, scheduler_config
from aicluster.core import parse_cluster
from aicluster.sim import SimConfig, simulate, summarize
from calibration import build, interpreter_ms
from philly_jobs import add_host_options, philly_jobs

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fifo,sjf,tiresias,fair")
    parser.add_argument("--cluster", default=str(ROOT / "examples/clusters/philly-512.yaml"))
    parser.add_argument("--limit", type=int, default=12000, help="replay the first N jobs")
    parser.add_argument("--config", type=Path, default=None, help="a configuration file")
    add_host_options(parser)
    args = parser.parse_args()
    scheduler = None
    if args.config is not None:
        configuration, _ = parse_configuration(args.config.read_text(), str(args.config))
        scheduler = scheduler_config(configuration, explain=False)
    cluster_path = Path(args.cluster)
    cluster = parse_cluster(cluster_path.read_text(), str(cluster_path))
    jobs = philly_jobs(args.limit or None, args)
    print(
        f"source {Path(aicluster.__file__).parent}; {len(jobs):,} jobs; interpreter speed "
        f"{interpreter_ms():.0f} ms (bench/calibration.py: lower is faster); scheduler {build()}",
        flush=True,
    )
    for policy in args.policies.split(","):
        cpu = time.process_time()
        result = simulate(cluster, jobs, policy, config=SimConfig(), scheduler=scheduler)
        cpu = time.process_time() - cpu
        summary = summarize(result)
        summary.pop("wall_seconds")
        summary.pop("jobs_per_second")
        table = result.jobs
        text = repr(
            (sorted(summary.items()), list(table.start), list(table.end), list(table.restarts))
        )
        digest = hashlib.sha256(text.encode()).hexdigest()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"{policy:<9} cpu {cpu:7.1f} s  cycles {summary['cycles']:>7,}  "
            f"preemptions {summary['preemptions']:>6,}  hash {digest[:16]}  load {load}",
            flush=True,
        )


if __name__ == "__main__":
    main()
