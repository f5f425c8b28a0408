"""Submit throughput of the store: single-job submit transactions per second and latency.

Prints figures, asserts nothing. Each submit is one committed transaction (SQLite: WAL with
synchronous=FULL, so one fsync per commit; PostgreSQL: synchronous_commit as the server has it).

    .venv/bin/python bench/store_submit.py                       # SQLite in a temporary directory
    .venv/bin/python bench/store_submit.py --url postgresql://postgres@127.0.0.1/bench
    .venv/bin/python bench/store_submit.py --threads 8 --count 4000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from aicluster.core import Tenant, jobspec_from_mapping
from aicluster.store import Store

SPEC = jobspec_from_mapping(
    {
        "name": "bench",
        "entrypoint": "examples/jobs/tiny_gpt.py",
        "args": ["--steps", "200"],
        "workers": 4,
        "resources": {"gpus": 1},
        "env": {"A": "1"},
    }
)


def run(store: Store, count: int, threads: int, keyed: bool) -> tuple[float, list[float]]:
    latencies: list[float] = []
    lock = threading.Lock()
    per_thread = count // threads
    prefix = f"{time.time_ns()}-"

    def worker(index: int) -> None:
        mine = []
        for n in range(per_thread):
            key = f"{prefix}{index}-{n}" if keyed else None
            start = time.perf_counter()
            store.submit_job("bench", SPEC, "user:bench", idempotency_key=key)
            mine.append(time.perf_counter() - start)
        with lock:
            latencies.extend(mine)

    started = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return time.perf_counter() - started, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: SQLite in a temporary directory)")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        store = Store.open(args.url or scratch)
        try:
            store.put_tenant(Tenant("bench"), "bench")
            run(store, 50, 1, False)  # warm the pool and caches
            print(f"store {store.dialect} ({store.url})")
            for threads in args.threads:
                for keyed in (False, True):
                    elapsed, lat = run(store, args.count, threads, keyed)
                    lat.sort()
                    p50 = statistics.median(lat) * 1000
                    p99 = lat[int(len(lat) * 0.99) - 1] * 1000
                    print(
                        f"threads={threads} idempotency_key={'yes' if keyed else 'no '} "
                        f"submits={len(lat)} rate={len(lat) / elapsed:7.0f}/s "
                        f"p50={p50:6.2f}ms p99={p99:6.2f}ms max={lat[-1] * 1000:6.1f}ms"
                    )
        finally:
            store.close()


if __name__ == "__main__":
    main()
