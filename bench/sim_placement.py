"""What topology-aware placement buys: a Philly replay placing gangs by topology and at random.

    nice -n 10 .venv/bin/python bench/sim_placement.py [--policy fair] [--limit N]
        [--config examples/config/communication.yaml]

Each placement strategy (``placement.strategy``: ``topology``, the scheduler's default, and
``random``, the seeded baseline) replays the trace on ``examples/clusters/philly-512.yaml``
twice: with the configuration's communication model (``--config``; by default the Philly size
classes of ``examples/config/communication.yaml``: a gang spread over slower links runs longer,
``docs/simulator.md``, "Communication") and without it (every sensitivity 0). Prints JCT and
slowdown (JCT / trace duration) over completed jobs, and the replay's CPU seconds. The JCT
figures are simulated: they do not depend on the machine; the CPU seconds do.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from aicluster.configuration import parse_configuration, scheduler_config, sim_config
from aicluster.core import parse_cluster
from aicluster.sim import load_philly, simulate, summarize

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("jct_mean", "jct_median", "jct_p95", "slowdown_mean", "slowdown_median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default=None, help="queue policy (default: the config's)")
    parser.add_argument("--cluster", type=Path, default=ROOT / "examples/clusters/philly-512.yaml")
    parser.add_argument("--config", type=Path, default=ROOT / "examples/config/communication.yaml")
    parser.add_argument("--limit", type=int, default=0, help="replay the first N jobs (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the random strategy's seed")
    args = parser.parse_args()
    configuration, _ = parse_configuration(args.config.read_text(), str(args.config))
    scheduler = scheduler_config(configuration, explain=False)
    if args.policy is not None:
        scheduler = scheduler.with_queue(args.policy)
    with_model = sim_config(configuration)
    without_model = replace(with_model, comm_sensitivity=())
    cluster = parse_cluster(args.cluster.read_text(), str(args.cluster))
    jobs = load_philly()[: args.limit or None]
    print(
        f"{len(jobs):,} Philly jobs on {cluster.name}, policy {scheduler.queue}, "
        f"communication classes {with_model.comm_sensitivity} ({args.config.name}), "
        f"bandwidths {cluster.bandwidth}",
        flush=True,
    )
    print(f"{'placement':<9} {'comm':<4} " + " ".join(f"{c:>15}" for c in COLUMNS) + "   cpu s")
    for strategy in ("topology", "random"):
        placed = replace(scheduler, placement=strategy, placement_seed=args.seed)
        for label, sim in (("on", with_model), ("off", without_model)):
            cpu = time.process_time()
            summary = summarize(simulate(cluster, jobs, scheduler=placed, config=sim))
            cpu = time.process_time() - cpu
            figures = " ".join(f"{summary[c]:>15,.2f}" for c in COLUMNS)
            print(f"{strategy:<9} {label:<4} {figures} {cpu:7.1f}", flush=True)


if __name__ == "__main__":
    main()
