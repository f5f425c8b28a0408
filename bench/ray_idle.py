"""What an idle embedded Ray cluster costs in CPU: a 4-node cluster (the tests' session
cluster) with ``--actors`` idle actors, measured over ``--seconds`` after a settling pause.

Prints each idle actor's share of a core and that of every Ray process together (raylets, GCS,
agents, the dashboard's API server, the actors), from ``/proc/<pid>/stat``.

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 .venv/bin/python bench/ray_idle.py
"""

from __future__ import annotations

import argparse
import os
import time

import ray

from aicluster.runtime import EmbeddedCluster, embedded_topology

TICKS = os.sysconf("SC_CLK_TCK")


class Idle:
    def pid(self) -> int:
        return os.getpid()


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def ray_pids() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if b"ray" in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--actors", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=20.0)
    args = parser.parse_args()
    with EmbeddedCluster(embedded_topology(nodes=4, gpus_per_node=8)) as cluster:
        cluster.connect()
        actors = [ray.remote(num_cpus=0)(Idle).remote() for _ in range(args.actors)]
        pids = ray.get([actor.pid.remote() for actor in actors])  # type: ignore[attr-defined]
        time.sleep(args.settle)
        every = ray_pids()
        before = [cpu_seconds(p) for p in pids], [cpu_seconds(p) for p in every]
        time.sleep(args.seconds)
        after = [cpu_seconds(p) for p in pids], [cpu_seconds(p) for p in every]
        per_actor = (sum(after[0]) - sum(before[0])) / args.seconds / len(pids) * 100
        total = (sum(after[1]) - sum(before[1])) / args.seconds * 100
        print(f"{len(pids)} idle actors: {per_actor:.2f}% of a core each")
        print(f"every Ray process of the 4-node cluster: {total:.1f}% of a core")


if __name__ == "__main__":
    main()
