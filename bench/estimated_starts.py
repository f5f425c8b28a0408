"""What one forecast of estimated starts (``aicluster.sim.forecast``) costs the live loop's thread.

512 nodes (4,096 GPUs), 6,000 jobs of 1–32 GPUs with run-time estimates of 10 minutes to 10
hours, 5 tenants: one scheduling cycle starts what fits, the rest queue; then the forecast of
the first N queued jobs (``estimates.max_jobs``) is timed, for each N given. Prints figures,
asserts nothing.

    .venv/bin/python bench/estimated_starts.py
    .venv/bin/python bench/estimated_starts.py --policy fair --jobs 100 1000 5000
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from aicluster.control.views.queueview import queue_order  # noqa: E402
from aicluster.scheduler import SchedulerConfig, make_state, schedule  # noqa: E402
from aicluster.sim.forecast import estimate_starts  # noqa: E402
from builders import make_job, small_cluster  # noqa: E402

WEEK = 7 * 86_400.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000])
    args = parser.parse_args()
    rng = random.Random(1)
    config = SchedulerConfig(queue=args.policy, backfill="easy")
    state = make_state(small_cluster(nodes=512, gpus=8, per_rack=16), {}, config)
    for i in range(6000):
        gpus = rng.choice([1, 2, 4, 8, 16, 32])
        job = make_job(f"j{i}").gpus(gpus).tenant(f"t{i % 5}").estimate(rng.uniform(600, 36_000))
        state.submit(job.build(), 0.0)
    for admit in schedule(state.snapshot(0.0)).admissions:
        state.start(admit.job_id, admit.placement, 0.0)
    order = queue_order(state, 100.0)
    print(f"{args.policy}: {len(state.running)} running, {len(state.pending)} queued")
    for count in args.jobs:
        started = time.perf_counter()
        starts = estimate_starts(state, 100.0, order[:count], WEEK, launch_s=5.0)
        seconds = time.perf_counter() - started
        found = sum(start is not None for start in starts.values())
        print(f"  first {count:>5} queued: {seconds:6.2f} s ({found} estimated)")


if __name__ == "__main__":
    main()
