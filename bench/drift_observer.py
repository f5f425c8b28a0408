"""Cost of the drift observer on the gateway's hot path, and of scoring a version.

The observer runs on every routed prediction (``Gateway.observers``); it keeps one request in
``sample_every`` and counts that request's feature into the window. This times, in one process
with no I/O: a call that is skipped by sampling, a call that is counted (a tiny_gpt prompt of
64 characters over a 65-character vocabulary; a numeric feature of 8 values), the average per
request at the default sampling, and one ``scores()`` pass (the leader's tick and a /metrics
scrape). Times are CPU time of this process (``time.process_time``): on a shared machine they
move far less than wall time. Prints a table; asserts nothing.

    .venv/bin/python bench/drift_observer.py
    .venv/bin/python bench/drift_observer.py --sample-every 1 --calls 200000
"""

from __future__ import annotations

import argparse
import random
import string
import time
from collections.abc import Callable
from typing import Any

from aicluster.core import ManualClock
from aicluster.serve.drift import DriftMonitor

VOCAB = sorted(set(string.ascii_letters + string.digits + " .,;:!?'\n-"))[:65]
CATEGORICAL = {
    "feature": "prompt",
    "kind": "categorical",
    "categories": VOCAB,
    "reference": [1 / len(VOCAB)] * len(VOCAB),
}
NUMERIC = {
    "feature": "x",
    "kind": "numeric",
    "edges": [-1.28, -0.84, -0.52, -0.25, 0.0, 0.25, 0.52, 0.84, 1.28],
    "reference": [0.1] * 10,
}


def per_call_us(monitor: DriftMonitor, inputs: list[dict[str, Any]], calls: int) -> float:
    started = time.process_time()
    for i in range(calls):
        monitor("t", "m", 1, inputs[i % len(inputs)])
    return (time.process_time() - started) / calls * 1e6


def timed_us(action: Callable[[], object], repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        action()
    return (time.process_time() - started) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--sample-every", type=int, default=8)
    args = parser.parse_args()
    rng = random.Random(0)
    prompts = [{"prompt": "".join(rng.choices(VOCAB, k=64))} for _ in range(1000)]
    vectors = [{"x": [rng.gauss(0, 1) for _ in range(8)]} for _ in range(1000)]
    print(f"{'feature':<28} {'skipped µs':>11} {'counted µs':>11} {'avg µs':>8} {'score µs':>9}")
    for label, reference, inputs in (
        ("categorical, 64-char prompt", CATEGORICAL, prompts),
        ("numeric, 8 values", NUMERIC, vectors),
    ):
        clock = ManualClock(0.0)
        counted = DriftMonitor(lambda t, n, v, r=reference: r, clock, sample_every=1)
        skipped = DriftMonitor(lambda t, n, v, r=reference: r, clock, sample_every=10**9)
        skipped("t", "m", 1, inputs[0])  # the first call of a version is always counted
        default = DriftMonitor(
            lambda t, n, v, r=reference: r, clock, sample_every=args.sample_every
        )
        row = (
            per_call_us(skipped, inputs, args.calls),
            per_call_us(counted, inputs, args.calls // 4),
            per_call_us(default, inputs, args.calls),
            timed_us(counted.scores, 200),
        )
        print(f"{label:<28} {row[0]:>11.2f} {row[1]:>11.2f} {row[2]:>8.2f} {row[3]:>9.1f}")
    print(f"(avg: 1 request in {args.sample_every} counted)")


if __name__ == "__main__":
    main()
