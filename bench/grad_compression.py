"""Gradient compression on the DDP example: bytes per step and loss, plain against compressed.

    .venv/bin/python bench/grad_compression.py [--steps 200] [--ranks 2] [--powersgd-rank 2]

Runs ``examples/jobs/ddp_mlp.py`` unmodified as a local gloo gang under the runtime's step
shim (as the runtime starts ranks), once with DDP's plain all-reduce, once per hook (PowerSGD
from iteration 2, fp16, bf16), and prints per hook: the bytes a rank hands to collectives per
step (median once compression is on), the reduction against plain, the loss on the whole
dataset after the last step and its difference from plain, and the wall time. Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from ranks import DDP_MLP, final_loss, run_ranks, steps


def measure(hook: str, args: argparse.Namespace) -> tuple[float, float, float]:
    env = {"AICLUSTER_COMM_HOOK": hook, "AICLUSTER_COMM_RANK": str(args.powersgd_rank)}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        script_args = ["--steps", str(args.steps), "--checkpoint-every", "0"]
        ranks = run_ranks(DDP_MLP, script_args, args.ranks, Path(folder), env)
        loss = final_loss(Path(folder))
    per_rank = [steps(records) for records in ranks]
    sent = statistics.median(r["metrics"]["comm_bytes"] for r in per_rank[0][10:])
    return sent, loss, time.perf_counter() - started


HEADER = (
    f"{'hook':<11} {'bytes/step':>10} {'reduction':>9} {'loss':>8} {'vs plain':>8} {'wall s':>6}"
)


def row(name: str, sent: float, reduction: float, loss: float, change: float, took: float) -> str:
    return f"{name:<11} {sent:>10,.0f} {reduction:>8.1f}x {loss:>8.5f} {change:>+8.1%} {took:>6.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--powersgd-rank", type=int, default=2)
    args = parser.parse_args()
    plain_sent, plain_loss, took = measure("", args)
    print(HEADER)
    print(row("plain", plain_sent, 1.0, plain_loss, 0.0, took))
    for hook in ("powersgd", "fp16", "bf16"):
        sent, loss, took = measure(hook, args)
        name = f"powersgd r{args.powersgd_rank}" if hook == "powersgd" else hook
        print(row(name, sent, plain_sent / sent, loss, (loss - plain_loss) / plain_loss, took))


if __name__ == "__main__":
    main()
