"""A gang that trains until its test releases it: one all-reduce per step, until a file exists.

The ranks agree on when to stop (an all-reduce of "rank r sees the release file"), so the gang ends
together and exits 0 however long a test needs it to run (a server restart on a loaded machine).
``--max-seconds`` ends it with exit code 4 if no test ever releases it; ``--ignore-sigterm`` makes
a stop wait for its grace period (SIGKILL), so a test can act while a stop is in flight.

    python until_released.py --release FILE [--step-sleep 0.2] [--max-seconds 600]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import aicluster.train as train


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--step-sleep", type=float, default=0.2)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args(argv)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
    ctx = train.init()
    print(f"rank {ctx.rank}/{ctx.world_size} attempt {ctx.attempt} pid {os.getpid()}", flush=True)
    deadline = time.monotonic() + args.max_seconds
    released = torch.zeros(1)
    step = 0
    while True:
        step += 1
        released[0] = 1.0 if args.release.exists() else 0.0
        dist.all_reduce(released, op=dist.ReduceOp.MAX)
        train.report(step, loss=1.0 / step, samples=1)
        if released.item() > 0:
            break
        if time.monotonic() > deadline:
            print(f"rank {ctx.rank}: never released", file=sys.stderr, flush=True)
            return 4
        time.sleep(args.step_sleep)
    print(f"rank {ctx.rank} released after step {step}", flush=True)
    train.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
