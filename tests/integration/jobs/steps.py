"""A test job: reports ``--steps`` steps ``--step-seconds`` apart, then exits ``--exit-code``."""

import argparse
import time

from aicluster import train

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument("--exit-code", type=int, default=0)
args = parser.parse_args()

train.init()
for step in range(1, args.steps + 1):
    time.sleep(args.step_seconds)
    train.report(step, loss=1.0 / step, samples=1)
print(f"done after {args.steps} steps", flush=True)
raise SystemExit(args.exit_code)
