"""Control-loop tick time with a big queue: 1,000 nodes (8,000 GPUs) and 5,000 jobs.

A real SQLite store and a real ``ControlLoop`` without Ray (the loop places what fits; the rest
queues). Times the first tick (it takes every job in) and the steady ticks after it, when only a
few jobs change between ticks, which is what a live cluster's loop does once a second. With
``--estimates`` the first tick also makes the queue's estimated starts (every 30 s live, so no
steady tick here does), and their share is printed apart; without it (the default) the loop
makes none, so that the figures compare with the loop before estimates existed (issue 16's bar,
docs/benchmarks.md); bench/estimated_starts.py measures a forecast alone. Prints figures,
asserts nothing.

    .venv/bin/python bench/control_tick.py
    .venv/bin/python bench/control_tick.py --nodes 1000 --jobs 5000 --ticks 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

from liveplane import racks  # noqa: E402

from aicluster.control.loop.loop import ControlLoop  # noqa: E402
from aicluster.control.settings import LoopSettings  # noqa: E402
from aicluster.core import Tenant  # noqa: E402
from aicluster.scheduler import SchedulerConfig  # noqa: E402
from aicluster.sim.forecast import ForecastOptions  # noqa: E402
from aicluster.store import Store  # noqa: E402
from aicluster.store.base import WallClock  # noqa: E402
from dashboard_load import populate  # noqa: E402
from instructions import counted  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--ticks", type=int, default=10)
    parser.add_argument("--estimates", action="store_true", help="estimate starts (first tick)")
    args = parser.parse_args()
    tenants = ["a", "b", "c", "d"]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp))
        for name in tenants:
            store.create_tenant(Tenant(name, {"H100": args.nodes * 2}), "bench")
        store.upsert_nodes(racks(1, args.nodes // 20, 20))
        populate(store, tenants, args.jobs)
        config = SchedulerConfig(queue="fair", backfill="easy", preemption=True)
        # The forecast within the first tick (not in the background), so that it is timed there.
        in_tick = ForecastOptions(background=False)
        settings = LoopSettings(config, estimates=in_tick if args.estimates else None)
        loop = ControlLoop(store, None, None, WallClock(), settings)
        with counted("first tick", collector_off=True):
            started = time.perf_counter()
            loop.tick()
            first = time.perf_counter() - started
        forecast = loop.stats.last_forecast_seconds
        steady = []
        for n in range(args.ticks):
            # A little churn between ticks, as on a live cluster: a new job arrives.
            populate(store, tenants[:1], 1, seed=n)
            with counted("steady tick", collector_off=True):
                started = time.perf_counter()
                loop.tick()
                steady.append(time.perf_counter() - started)
        store.close()
    print(f"nodes {args.nodes}, jobs {args.jobs}")
    print(f"first tick     {first:7.3f} s (takes every job in)")
    if args.estimates:
        print(
            f"  of which     {forecast:7.3f} s estimating starts ({loop.stats.forecasts} forecast)"
        )
    print(
        f"steady ticks   median {statistics.median(steady) * 1000:7.1f} ms, "
        f"max {max(steady) * 1000:7.1f} ms over {args.ticks}"
    )


if __name__ == "__main__":
    main()
