"""Dashboard page load on a big cluster: 1,000 nodes (8,000 GPUs), 5,000 jobs.

A real server over a live control loop (no Ray; the loop places what fits, the rest queues), and
Debian's chromium driven by Playwright. For each view, a fresh page load (token already in the
tab's session storage) until the view has rendered its data, as the page itself marks it
(``performance.mark('ready:<view>')``, milliseconds since navigation start). Prints figures,
asserts nothing; screenshots of the map go to test-artifacts/bench-cluster-map-*.png.

    .venv/bin/python bench/dashboard_load.py
    .venv/bin/python bench/dashboard_load.py --nodes 1000 --jobs 5000 --runs 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

from apiserver import serve  # noqa: E402
from browser import ARTIFACTS, LAPTOP, WIDE, chromium  # noqa: E402
from liveplane import leading, open_live_plane, racks, submit, users  # noqa: E402

from aicluster.control import ControlPlane  # noqa: E402
from aicluster.core import Tenant  # noqa: E402
from aicluster.scheduler import SchedulerConfig  # noqa: E402
from aicluster.store import Role, Store  # noqa: E402

SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]  # (workers, GPUs per worker)
WEIGHTS = [30, 20, 20, 15, 10, 5]
VIEWS = ["cluster", "queue", "jobs", "tenants"]


def populate(store: Store, tenants: list[str], jobs: int, seed: int = 7) -> float:
    """Submit ``jobs`` jobs over the tenants from 16 threads (SQLite group commit)."""
    rng = random.Random(seed)
    work = [(rng.choice(tenants), rng.choices(SHAPES, WEIGHTS)[0], n) for n in range(jobs)]
    started = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda w: submit(store, w[0], f"job-{w[2]}", *w[1]), work))
    return time.perf_counter() - started


def settle(plane: ControlPlane, jobs: int, timeout: float = 900.0) -> int:
    """Wait until every job is placed or in the published queue; returns how many are placed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        placed = len(plane.store.placed_jobs())
        if placed + len(plane.queue()) >= jobs:
            return placed
        time.sleep(1.0)
    raise TimeoutError("the control loop did not settle")


#: When the cluster map's data had arrived (ms since navigation start), from resource timing.
MAP_ARRIVED = (
    "performance.getEntriesByType('resource')"
    ".filter(e => e.name.includes('/v1/ui/cluster-map'))[0].responseEnd"
)


def load_times(url: str, token: str, runs: int, shots: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {view: [] for view in [*VIEWS, "map data"]}
    with chromium() as browser:
        context = browser.new_context(viewport=LAPTOP)
        # signed in: the session cookie POST /v1/ui/session would have set
        cookie = {"name": "aicluster_session", "value": token, "url": url, "httpOnly": True}
        context.add_cookies([{**cookie, "sameSite": "Strict"}])
        page = context.new_page()
        for _ in range(runs):
            for view in VIEWS:
                page.goto("about:blank")
                page.goto(f"{url}/ui/#/{view}")
                page.wait_for_selector("#view[data-ready]", timeout=60_000)
                mark = page.evaluate(f"performance.getEntriesByName('ready:{view}')[0].startTime")
                times[view].append(float(mark))
                if view == "cluster":
                    times["map data"].append(float(page.evaluate(MAP_ARRIVED)))
        for size in (LAPTOP, WIDE):  # how a big cluster looks, for the eye
            page.set_viewport_size(size)
            page.goto("about:blank")
            page.goto(f"{url}/ui/#/cluster")
            page.wait_for_selector("#view[data-ready]", timeout=60_000)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"{shots}-{size['width']}x{size['height']}.png"))
        context.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="multiple of 250")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    names = [f"team-{i}" for i in range(8)]
    share = args.nodes * 8 // len(names)
    tenants = [Tenant(n, quota={"H100": share}, borrow_limit={"H100": share // 2}) for n in names]
    with tempfile.TemporaryDirectory() as tmp:
        # No preemption: without Ray nothing runs, so fair-share preemption would churn for ever.
        config = SchedulerConfig(queue="fair", backfill="easy", preemption=False)
        topology = racks(args.nodes // 250, 10, 25)
        # The server's default loop period (1 s), as `aicluster up` runs it.
        plane = open_live_plane(Path(tmp), tenants, topology, config, interval_s=1.0)
        tokens = users(plane.store, {"member": (names[0], Role.MEMBER)})
        submitted = populate(plane.store, names, args.jobs)
        print(f"{args.nodes} nodes, {args.jobs} jobs submitted in {submitted:.1f} s")
        with leading(plane), serve(plane) as url:
            started = time.perf_counter()
            placed = settle(plane, args.jobs)
            print(f"control loop placed {placed} jobs in {time.perf_counter() - started:.1f} s; "
                  f"{len(plane.queue())} pending")  # fmt: skip
            for who in ("admin", "member"):
                headers = {"Authorization": f"Bearer {tokens[who]}"}
                with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                    t0 = time.perf_counter()
                    size = len(client.get("/v1/ui/cluster-map").content)
                    api_ms = 1000 * (time.perf_counter() - t0)
                print(f"\n{who}: GET /v1/ui/cluster-map {size / 1024:.0f} KiB in {api_ms:.0f} ms")
                times = load_times(url, tokens[who], args.runs, f"bench-cluster-map-{who}")
                runs = f"(page load to rendered data, {args.runs} runs)"
                print(f"{'view':10} {'median ms':>10} {'max ms':>8}  {runs}")
                for view, values in times.items():
                    print(f"{view:10} {statistics.median(values):10.0f} {max(values):8.0f}")
        plane.store.close()


if __name__ == "__main__":
    main()
