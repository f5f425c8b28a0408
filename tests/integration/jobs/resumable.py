"""A test job that checkpoints as a real one does: ``--steps`` steps of ``--step-seconds``, a
checkpoint every ``--every`` steps and one when asked to stop (SIGTERM, then the preemption's
grace period), then exit 0; a new run resumes from the newest checkpoint. Every step is reported,
so the first step of a run shows where it resumed."""

import argparse
import time

import torch

from aicluster import train

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--step-seconds", type=float, default=0.2)
parser.add_argument("--every", type=int, default=10)
args = parser.parse_args()

train.init()
model = torch.nn.Linear(2, 2)
checkpointer = train.Checkpointer(async_save=False)
resumed = checkpointer.load(model=model)
start = resumed.step + 1 if resumed is not None else 1
print(f"starting at step {start}", flush=True)
for step in range(start, args.steps + 1):
    time.sleep(args.step_seconds)
    train.report(step, loss=1.0 / step, compute_time=args.step_seconds)
    if train.should_stop():
        checkpointer.save(step, model=model, extra={"why": "stop"})
        checkpointer.close()
        print(f"stopped after step {step}", flush=True)
        raise SystemExit(0)
    if step % args.every == 0:
        checkpointer.save(step, model=model)
checkpointer.close()
print(f"done after {args.steps} steps", flush=True)
