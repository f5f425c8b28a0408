"""Power saving on a Philly window: always-on against power save under the same policy.

    .venv/bin/python bench/power_save.py [--start 0] [--limit 3000] [--suspend-after 300,900]

Replays jobs ``start .. start+limit`` of the Philly trace (times shifted to start at 0) on
``examples/clusters/philly-512-power.yaml`` (the 512-GPU replay cluster with a base draw per
node and per CPU) with ``examples/config/power-save.yaml``, first with every node on, then with
each ``suspend_after`` value in turn (the file's other power settings kept). Failures are off in
both, so that only power saving differs. Prints energy and mean JCT per setting and their change
against always-on; the target is energy -10% or better with mean JCT +10% or less.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

from aicluster.configuration import parse_configuration, scheduler_config, sim_config
from aicluster.core import parse_cluster
from aicluster.sim import Simulator, TraceJob, load_philly, summarize

ROOT = Path(__file__).resolve().parents[1]


def window(start: int, limit: int) -> list[TraceJob]:
    jobs = load_philly()[start : start + limit]
    first = jobs[0].submit_time
    return [replace(job, submit_time=job.submit_time - first) for job in jobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--suspend-after", default="300,900,1800,3600")
    parser.add_argument("--cluster", default=str(ROOT / "examples/clusters/philly-512-power.yaml"))
    parser.add_argument("--config", default=str(ROOT / "examples/config/power-save.yaml"))
    args = parser.parse_args()
    cluster = parse_cluster(Path(args.cluster).read_text(), args.cluster)
    configuration, tenants = parse_configuration(Path(args.config).read_text(), args.config)
    scheduler = scheduler_config(configuration, explain=False)
    policy = scheduler.power
    if policy is None:
        parser.error(f"{args.config} sets no power.suspend_after_s")
    simulation = sim_config(configuration, failures=False)
    jobs = window(args.start, args.limit)
    print(
        f"{len(jobs):,} Philly jobs from #{args.start}, {cluster.total_gpus} GPUs, "
        f"policy {scheduler.queue}; {policy}"
    )
    print(
        f"{'suspend_after':>13} {'energy kWh':>11} {'Δ energy':>9} {'mean JCT h':>11} "
        f"{'Δ JCT':>7} {'suspends':>9} {'util':>5} {'days':>5} {'cpu s':>6}  target"
    )
    base: tuple[float, float] | None = None
    for after in [None, *(float(x) for x in args.suspend_after.split(","))]:
        power = None if after is None else replace(policy, suspend_after=after)
        cpu = time.process_time()
        sim = Simulator(
            cluster,
            jobs,
            tenants=tenants,
            scheduler=replace(scheduler, power=power),
            config=simulation,
        )
        summary = summarize(sim.run())
        energy, jct = summary["energy_kwh"], summary["jct_mean"] / 3600
        base = base or (energy, jct)
        d_energy, d_jct = energy / base[0] - 1, jct / base[1] - 1
        suspends = sum(1 for t in sim.transitions if t.after.value == "suspending")
        met = "met" if d_energy <= -0.10 and d_jct <= 0.10 else "-"
        label = "always-on" if after is None else f"{after:.0f} s"
        days = summary["simulated_seconds"] / 86400
        print(
            f"{label:>13} {energy:>11,.0f} {d_energy:>+9.1%} {jct:>11.2f} {d_jct:>+7.1%} "
            f"{suspends:>9,} {summary['utilization']:>5.0%} {days:>5.1f} "
            f"{time.process_time() - cpu:>6.0f}  {met}",
            flush=True,
        )
    print(f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
