"""The cost of preemption on Philly, with and without the protections against thrashing.

    nice -n 10 .venv/bin/python bench/philly_preemption.py [--policies fifo,sjf,tiresias,fair]
        [--limit N] [--tenants] [--max-cpu-s 900] [--comm on,off] [--protections off,default]
        [--promote-backoff 2] [--promote-backoff-after 8]

Each policy replays the trace on ``examples/clusters/philly-512.yaml`` (64 nodes of 8 GPUs) four
times: the communication model on (``examples/config/communication.yaml``: Philly's size classes)
and off, each with the protections off (``preemption.min_runtime_s`` and ``cooldown_s`` 0,
Tiresias' promotion wait constant: the rights of issue 34 item 1 alone) and with their defaults
(600 s, 300 s, and a promotion wait doubling per requeue past the eighth); ``--comm`` and
``--protections`` pick among these four. Prints preemptions per job, GPU-hours lost to
preemption, mean and p99 JCT (hours, completed jobs), and the replay's CPU seconds.
``--tenants``: Philly's virtual clusters (the trace's tenant column) become tenants with quotas
in proportion to their GPU-time (largest remainder, 512 in all) and borrowing up to the whole
cluster, so reclaim and the borrowers' rights run on real load; preemptions are then split
by kind, and each tenant's preemptions, lost GPU-hours and mean JCT follow its policy's row.
A replay that takes over ``--max-cpu-s`` CPU seconds is stopped and reported as such, with how
far it got (a thrashing replay may never finish). The figures are simulated; the CPU seconds
depend on the machine.
"""

from __future__ import annotations

import argparse
import math
import signal
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

from aicluster.configuration import parse_configuration, sim_config
from aicluster.core import Cluster, Tenant, parse_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, SimResult, Simulator, TraceJob, load_philly, summarize
from aicluster.sim.metrics import preemption_summary

ROOT = Path(__file__).resolve().parents[1]


class OutOfTime(Exception):
    """The replay used up its CPU seconds."""


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise OutOfTime


def philly_tenants(jobs: list[TraceJob], total: int, gpu_type: str) -> dict[str, Tenant]:
    """Each virtual cluster a tenant, its quota its share of the trace's GPU-time of ``total``
    GPUs (largest remainder), borrowing up to the whole cluster."""
    gpu_time: dict[str, float] = defaultdict(float)
    for job in jobs:
        gpu_time[job.tenant] += job.num_gpus * job.duration
    whole = sum(gpu_time.values()) or 1.0
    exact = {name: total * seconds / whole for name, seconds in gpu_time.items()}
    quota = {name: int(share) for name, share in exact.items()}
    by_remainder = sorted(exact, key=lambda name: exact[name] - quota[name], reverse=True)
    for name in by_remainder[: total - sum(quota.values())]:
        quota[name] += 1
    return {
        name: Tenant(name, quota={gpu_type: quota[name]}, borrow_limit={gpu_type: total})
        for name in sorted(quota)
    }


def replay(
    cluster: Cluster,
    jobs: list[TraceJob],
    scheduler: SchedulerConfig,
    sim: SimConfig,
    tenants: dict[str, Tenant] | None,
    cpu_s: float,
) -> tuple[dict[str, Any], float]:
    """The run's summary and preemption cost, or, when it ran out of CPU time, how far it got
    (``{"stopped": True, ...}``: simulated days, jobs arrived and completed, preemptions so far)."""
    simulator = Simulator(cluster, jobs, tenants=tenants, scheduler=scheduler, config=sim)
    reached = [0.0, 0, 0]  # the last progress report: simulated time, arrived, completed

    def progress(now: float, arrived: int, completed: int) -> None:
        reached[:] = [now, arrived, completed]

    started = time.process_time()
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        result = simulator.run(progress)
    except OutOfTime:
        stopped = {
            "stopped": True,
            "days": reached[0] / 86400,
            "arrived": reached[1],
            "completed": reached[2],
            "preemptions": simulator.totals.preemptions,
        }
        return stopped, time.process_time() - started
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
    figures = {**summarize(result), **preemption_summary(result)}
    figures["jct_by_tenant"] = jct_by_tenant(result)
    return figures, time.process_time() - started


def jct_by_tenant(result: SimResult) -> dict[str, tuple[int, float]]:
    """Per tenant, its completed jobs and their mean JCT (seconds)."""
    times: dict[str, list[float]] = defaultdict(list)
    table = result.jobs
    for tenant, submit, end in zip(table.tenant, table.submit, table.end, strict=True):
        if not math.isnan(end):
            times[result.tenants[tenant]].append(end - submit)
    return {name: (len(jct), sum(jct) / len(jct)) for name, jct in sorted(times.items())}


def print_tenants(figures: dict[str, Any]) -> None:
    """Each tenant's preemptions by kind, GPU-hours lost and mean JCT."""
    print(
        f"  {'tenant':<10} {'jobs':>6} {'preempt':>8} {'lost GPUh':>10} {'JCT mean h':>10}  by kind"
    )
    jct = figures["jct_by_tenant"]
    for name, cost in figures["preemption_cost"].items():
        jobs, mean = jct.get(name, (0, math.nan))
        print(
            f"  {name:<10} {jobs:>6,} {cost['preemptions']:>8,} {cost['lost_gpu_hours']:>10,.0f} "
            f"{mean / 3600:>10.2f}  {cost['by_kind']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fifo,sjf,tiresias,fair")
    parser.add_argument("--cluster", type=Path, default=ROOT / "examples/clusters/philly-512.yaml")
    parser.add_argument("--config", type=Path, default=ROOT / "examples/config/communication.yaml")
    parser.add_argument("--limit", type=int, default=0, help="replay the first N jobs (0: all)")
    parser.add_argument("--tenants", action="store_true", help="virtual clusters as tenants")
    parser.add_argument("--max-cpu-s", type=float, default=900.0)
    parser.add_argument("--comm", default="on,off", help="the communication model: on, off or both")
    parser.add_argument("--protections", default="off,default", help="off, default or both")
    defaults = SchedulerConfig()
    parser.add_argument(
        "--promote-backoff",
        type=float,
        default=defaults.tiresias_promote_backoff,
        help="Tiresias' promotion backoff with the protections on",
    )
    parser.add_argument(
        "--promote-backoff-after",
        type=int,
        default=defaults.tiresias_promote_backoff_after,
        help="requeues before it applies",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGPROF, _stop)
    configuration, _ = parse_configuration(args.config.read_text(), str(args.config))
    with_model = sim_config(configuration)
    without_model = replace(with_model, comm_sensitivity=())
    cluster = parse_cluster(args.cluster.read_text(), str(args.cluster))
    jobs = load_philly()[: args.limit or None]
    gpu_type = cluster.nodes[0].gpu_type
    tenants = philly_tenants(jobs, cluster.total_gpus, gpu_type) if args.tenants else None
    print(f"{len(jobs):,} Philly jobs on {cluster.name}, tenants: {len(tenants or {}) or 'none'}")
    print(
        f"{'policy':<9} {'comm':<4} {'protect':<7} {'preempt/job':>11} {'lost GPUh':>10} "
        f"{'JCT mean h':>10} {'JCT p99 h':>10} {'cpu s':>7}  by kind"
    )
    for policy in args.policies.split(","):
        for comm, sim in (("on", with_model), ("off", without_model)):
            if comm not in args.comm.split(","):
                continue
            for label, protect in (("off", 0.0), ("default", None)):
                if label not in args.protections.split(","):
                    continue
                scheduler = SchedulerConfig(
                    queue=policy,
                    explain=False,
                    tiresias_promote_backoff=args.promote_backoff,
                    tiresias_promote_backoff_after=args.promote_backoff_after,
                )
                if protect is not None:  # off: no minimum, no cool-down, a constant wait
                    scheduler = replace(
                        scheduler,
                        min_runtime_s=protect,
                        cooldown_s=protect,
                        tiresias_promote_backoff=1.0,
                    )
                figures, cpu = replay(cluster, jobs, scheduler, sim, tenants, args.max_cpu_s)
                head = f"{policy:<9} {comm:<4} {label:<7}"
                if figures.get("stopped"):
                    print(
                        f"{head} did not finish in {cpu:.0f} CPU s: day {figures['days']:.1f}, "
                        f"{figures['completed']:,} of {figures['arrived']:,} jobs arrived done, "
                        f"{figures['preemptions']:,} preemptions so far",
                        flush=True,
                    )
                    continue
                print(
                    f"{head} {figures['preemptions'] / len(jobs):>11.3f} "
                    f"{figures['lost_gpu_hours_preemptions']:>10,.0f} "
                    f"{figures['jct_mean'] / 3600:>10.2f} {figures['jct_p99'] / 3600:>10.1f} "
                    f"{cpu:>7.1f}  {figures['preemptions_by_kind']}",
                    flush=True,
                )
                if tenants:
                    print_tenants(figures)


if __name__ == "__main__":
    main()
