"""A test job: ``--steps`` steps of ``--step-seconds`` each (rank ``--slow-rank`` takes
``--slowdown`` times longer), each reported with its compute time; then exits ``--exit-code``."""

import argparse
import time

from aicluster import train

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slowdown", type=float, default=1.0)
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()

context = train.init()
compute = args.step_seconds * (args.slowdown if context.rank == args.slow_rank else 1.0)
for step in range(1, args.steps + 1):
    time.sleep(compute)
    train.report(step, loss=1.0 / step, samples=1, compute_time=compute)
print(f"done after {args.steps} steps", flush=True)
raise SystemExit(args.exit_code)
