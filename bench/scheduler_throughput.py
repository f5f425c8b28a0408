"""Scheduler throughput: 10,000 GPUs (1,250 nodes × 8, 40 racks) and 50,000 pending gang jobs.

Prints, per policy: the first cycle on an empty cluster (placements and placements/s), and
steady-state cycles with the queue still ~50,000 deep after 5% of running jobs finish. With
``--host`` every worker also asks for CPUs and memory (6 CPUs and 48 GB per GPU, on nodes of
64 CPUs and 512 GB), so that the cycle places them too. Run:

    .venv/bin/python bench/scheduler_throughput.py [--policies fifo,tiresias,fair] [--jobs 50000]
    .venv/bin/python bench/scheduler_throughput.py --host
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

from aicluster.core import Job, make_cluster
from aicluster.scheduler import SchedulerConfig, SchedulerState, make_state, schedule
from instructions import counted

SIZES = [(1, 0.45), (2, 0.10), (4, 0.10), (8, 0.17), (16, 0.09), (32, 0.06), (64, 0.03)]


#: CPUs and memory (GB) per GPU a worker asks for with ``--host``.
HOST_PER_GPU = (6.0, 48.0)


def make_jobs(count: int, rng: random.Random, host: bool = False) -> list[Job]:
    sizes, weights = zip(*SIZES, strict=True)
    cpus, memory = HOST_PER_GPU if host else (0.0, 0.0)
    jobs = []
    for i in range(count):
        gpus = rng.choices(sizes, weights)[0]
        per_worker = min(gpus, 8)
        jobs.append(
            Job(
                id=f"job-{i}",
                tenant=f"team-{i % 16}",
                workers=gpus // per_worker,
                gpus_per_worker=per_worker,
                cpus_per_worker=cpus * per_worker,
                memory_gb_per_worker=memory * per_worker,
                submit_time=float(i),
                true_duration=rng.expovariate(1 / 3600),
            )
        )
    return jobs


def apply(state: SchedulerState, plan, now: float) -> None:  # type: ignore[no-untyped-def]
    for preempt in plan.preemptions:
        state.stop(preempt.job_id, now, requeue=True)
    for admit in plan.admissions:
        state.start(admit.job_id, admit.placement, now)


def bench(policy: str, jobs: list[Job], explain: bool, rng: random.Random) -> dict[str, float]:
    cluster = make_cluster(nodes=1250, gpus_per_node=8, nodes_per_rack=32, racks_per_pod=8)
    state = make_state(cluster, config=SchedulerConfig(queue=policy, explain=explain))
    for job in jobs:
        state.submit(job, 0.0)
    with counted(f"{policy} reasons={explain} first cycle", collector_off=True):
        started = time.perf_counter()
        plan = schedule(state.snapshot(0.0))
        first = time.perf_counter() - started
    apply(state, plan, 0.0)
    placed = len(plan.admissions)
    steady, steady_placed = [], 0
    for step in range(1, 6):
        now = step * 60.0
        for job_id in rng.sample(sorted(state.running), k=max(1, len(state.running) // 20)):
            state.stop(job_id, now, requeue=False)
        state.refresh(now)
        with counted(f"{policy} reasons={explain} steady cycle", collector_off=True):
            started = time.perf_counter()
            plan = schedule(state.snapshot(now))
            steady.append(time.perf_counter() - started)
        steady_placed += len(plan.admissions)
        apply(state, plan, now)
    return {
        "pending": float(len(jobs)),
        "first_cycle_s": first,
        "first_placements": float(placed),
        "placements_per_s": placed / first,
        "steady_cycle_s": statistics.median(steady),
        "steady_placements": steady_placed / len(steady),
        "gpus_used": float(cluster.total_gpus - sum(state.index.free)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="fifo,sjf,tiresias,fair,priority")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--host", action="store_true", help="workers ask for CPUs and memory too")
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print("cluster: 1,250 nodes x 8 GPUs = 10,000 GPUs in 40 racks; pending jobs:", args.jobs)
    header = (
        f"{'policy':<10}{'explain':>8}{'1st cycle s':>12}{'placed':>8}{'placements/s':>14}"
        f"{'steady cycle s':>16}{'placed/cycle':>14}"
    )
    print(header)
    for policy in args.policies.split(","):
        for explain in (False, True):
            rng = random.Random(args.seed)
            result = bench(policy, make_jobs(args.jobs, rng, args.host), explain, rng)
            print(
                f"{policy:<10}{explain!s:>8}{result['first_cycle_s']:>12.3f}"
                f"{result['first_placements']:>8.0f}{result['placements_per_s']:>14,.0f}"
                f"{result['steady_cycle_s']:>16.3f}{result['steady_placements']:>14.0f}"
            )


if __name__ == "__main__":
    main()
