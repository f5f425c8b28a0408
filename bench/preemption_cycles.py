"""A longer sweep of the preemption cycle checker (``tests/cycles.py``) than the unit suite's.

    nice -n 10 .venv/bin/python bench/preemption_cycles.py [--jobs 3] [--examples 5000] [--legacy]

Every tiny world of ``--jobs`` jobs (the suite checks two), then ``--examples`` random worlds of
up to 3 tenants, 3 nodes and 8 jobs (seeded). Prints the worlds covered, the seconds, and each
world that does not settle as a row for ``tests/unit/test_preemption_cycles.py``. ``--legacy``:
under the rights before issue 34 (which cycle).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from aicluster.scheduler.rights import LEGACY_RIGHTS, PreemptionRights
from cycles import POLICIES, Spec, World, cycle_of, row, tiny_worlds

_TENANTS = (
    (("a", None, None), ("b", None, None), ("c", None, None)),
    (("a", 0, 8), ("b", 4, 0), ("c", 2, 6)),
    (("a", 2, 4), ("b", 2, 4), ("c", 2, 4)),
    (("a", 4, 0), ("b", 0, 12), ("c", 4, 4)),
)


def _random_world(rng: random.Random) -> World:
    jobs = tuple(
        Spec(
            tenant=rng.choice("abc"),
            workers=rng.randint(1, 3),
            gpus=rng.choice((1, 2, 4)),
            priority=rng.choice((100, 200, 300)),
            preemptible=rng.random() < 0.8,
            service=rng.choice((0.0, 10.0, 100.0)),
            length=rng.choice((50.0, 150.0, 500.0)),
        )
        for _ in range(rng.randint(2, 8))
    )
    return World(
        rng.randint(1, 3), rng.choice((2, 4)), rng.choice(_TENANTS), jobs, rng.choice(POLICIES)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3, help="jobs of the tiny worlds")
    parser.add_argument("--examples", type=int, default=5000, help="random worlds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--legacy", action="store_true", help="the rights before issue 34")
    args = parser.parse_args()
    rights = LEGACY_RIGHTS if args.legacy else PreemptionRights()
    found = 0
    for name, worlds in (
        (f"tiny ({args.jobs} jobs)", tiny_worlds(args.jobs)),
        (
            "random",
            (_random_world(random.Random(args.seed * 1_000_003 + i)) for i in range(args.examples)),
        ),
    ):
        start, count = time.process_time(), 0
        for world in worlds:
            count += 1
            if cycle_of(world, rights) is not None:
                found += 1
                print(row(f"{name} #{count}", world), flush=True)
        print(f"{name}: {count} worlds, {time.process_time() - start:.1f} CPU s", flush=True)
    print(f"worlds that do not settle: {found}")


if __name__ == "__main__":
    main()
