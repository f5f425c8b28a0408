"""Recovery figures: a 4-worker DDP job on the embedded 4-node cluster through five killed worker
processes and one killed Ray node (the chaos run of tests/integration/test_chaos.py).

Prints, per failure, the steps lost and the time from the failure to the next completed step,
their median, the seconds spent in each phase of a restart (detection, requeue, scheduling,
placement group and actors, process start and imports, rendezvous, checkpoint load, first step;
see ``chaos.PHASES``), how many ranks were forked warm, and the job's goodput (ETTR). Run:

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 .venv/bin/python bench/recovery.py [--step-sleep 0.25]

The ETTR figure of ``docs/benchmarks.md``: ``--step-sleep 5 --checkpoint-every 1``.
``--sandbox`` runs the job's ranks in its tenant's sandbox, as ``aicluster up`` does (root and
bubblewrap needed); run once with and once without to see what the sandbox costs a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from chaos import PHASES, Failure, run_chaos

from aicluster.runtime import EmbeddedCluster, Runtime, embedded_topology
from aicluster.runtime.sandbox.bwrap import SandboxConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=320)
    parser.add_argument("--step-sleep", type=float, default=0.25, help="seconds added per step")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--every", type=int, default=50, help="steps between failures")
    parser.add_argument("--process-kills", type=int, default=5, help="plus one node kill")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the whole run")
    parser.add_argument("--state-parent", type=Path, default=None, help="for the state dir")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--sandbox", action="store_true", help="ranks in the tenant's sandbox")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(dir=args.state_parent) as state,
        EmbeddedCluster(embedded_topology()) as cluster,
    ):
        cluster.connect()
        sandbox = SandboxConfig() if args.sandbox else None
        runtime = Runtime(state, start_timeout_s=60, sandbox=sandbox)
        result = run_chaos(
            cluster,
            runtime,
            Path(state) / "store",
            steps=args.steps,
            step_sleep=args.step_sleep,
            checkpoint_every=args.checkpoint_every,
            every=args.every,
            process_kills=args.process_kills,
            timeout_s=args.timeout,
        )
    print(
        f"job {result.state} in {result.wall_s:.0f}s; {args.steps} steps, "
        f"{args.step_sleep}s sleep/step, checkpoint every {args.checkpoint_every} steps"
    )
    print(f"{'failure':<10}{'at step':>8}{'resumed':>9}{'lost':>6}{'recovery s':>12}")
    for failure in result.failures:
        recovery = f"{failure.recovery_s:.1f}" if failure.recovery_s is not None else "-"
        print(
            f"{failure.kind:<10}{failure.last_step:>8}{failure.resumed_step or 0:>9}"
            f"{failure.lost_steps or 0:>6}{recovery:>12}"
        )
    print_phases(result.failures)
    median = result.median_recovery_s
    print(f"median time from failure to the next completed step: {median:.1f}s" if median else "")
    g = result.goodput
    print(
        f"goodput: ETTR {g['ettr']:.1%} (productive {g['productive_seconds']:.0f}s, lost "
        f"{g['lost_seconds']:.0f}s, restarting {g['restart_seconds']:.0f}s, wall "
        f"{g['wall_seconds']:.0f}s, {g['checkpoints']:.0f} checkpoints)"
    )
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json is not None:
        failures = [{**vars(f), "recovery_s": f.recovery_s} for f in result.failures]
        figures = {"args": vars(args), "failures": failures, "goodput": g, "wall_s": result.wall_s}
        args.json.write_text(json.dumps(figures, indent=2, default=str))


def print_phases(failures: list[Failure]) -> None:
    """Seconds per recovery phase, per failure and the median over failures."""
    names = [name for name, _ in PHASES]
    print(f"{'phase':<12}" + "".join(f"{f.kind[:4]:>7}" for f in failures) + f"{'median':>8}")
    for name in names:
        values = [f.phases.get(name) for f in failures]
        known = [v for v in values if v is not None]
        cells = "".join(f"{v:>7.1f}" if v is not None else f"{'-':>7}" for v in values)
        median = f"{statistics.median(known):>8.1f}" if known else f"{'-':>8}"
        print(f"{name:<12}{cells}{median}")
    print(f"{'warm ranks':<12}" + "".join(f"{f.warm_ranks:>7}" for f in failures))


if __name__ == "__main__":
    main()
