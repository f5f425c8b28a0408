"""Holds its GPUs until stopped: joins its gang (its start record says where each rank's GPU
is) and reports a step a second until SIGTERM, then exits 0. Ends with 4 after --max-seconds."""

from __future__ import annotations

import argparse
import sys
import time

import aicluster.train as train


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args(argv)
    train.init()
    deadline = time.monotonic() + args.max_seconds
    step = 0
    while not train.should_stop():
        step += 1
        train.report(step, loss=1.0, samples=1)
        if time.monotonic() > deadline:
            return 4
        time.sleep(1.0)
    train.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
