"""Hybrid-parallel layouts of the GPT example: memory per rank and tokens per second.

    .venv/bin/python bench/parallel.py [--steps 30] [--width 128] [--layers 4]

Runs ``examples/jobs/gpt_hybrid.py`` as a local gang of four gloo ranks (under the runtime's
step shim, as the runtime starts ranks) in each layout: DDP over 4 ranks (the baseline), FSDP2
over 4, FSDP2 × tensor parallel 2 × 2, and two pipeline stages × FSDP2 over 2. Prints per layout
the bytes of parameters and optimizer state a rank holds (the largest rank's), that against
DDP's, tokens per second (the median step after the first five) and the last loss. On CPU with
gloo the collectives are memory copies between processes, so tokens per second here say what
each layout costs in communication and bookkeeping, not what it gains on GPUs. Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from ranks import ROOT, run_ranks, steps

GPT_HYBRID = ROOT / "examples/jobs/gpt_hybrid.py"
#: name: (AICLUSTER_PARALLELISM, extra flags)
LAYOUTS = {
    "DDP dp=4": ("data=4", ["--ddp"]),
    "FSDP2 dp=4": ("data=4", []),
    "FSDP2 dp=2 x tp=2": ("data=2,tensor=2", []),
    "pp=2 x FSDP2 dp=2": ("pipeline=2,data=2", []),
}


def measure(layout: str, flags: list[str], args: argparse.Namespace) -> tuple[float, float, float]:
    """(bytes held by the largest rank, tokens per second, last loss)."""
    model = ["--width", str(args.width), "--layers", str(args.layers), "--block", str(args.block)]
    script_args = ["--steps", str(args.steps), "--checkpoint-every", "0", *model, *flags]
    with tempfile.TemporaryDirectory() as folder:
        env = {"AICLUSTER_PARALLELISM": layout}
        ranks = [steps(r) for r in run_ranks(GPT_HYBRID, script_args, 4, Path(folder), env)]
    held = max(records[-1]["metrics"]["state_bytes"] for records in ranks)
    rank0 = ranks[0][5:]
    seconds = statistics.median(r["step_time"] for r in rank0)
    tokens = rank0[0]["metrics"]["tokens"]
    return held, tokens / seconds, ranks[0][-1]["loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--block", type=int, default=32)
    args = parser.parse_args()
    print(f"gpt_hybrid width {args.width}, {args.layers} layers, 4 gloo ranks, {args.steps} steps")
    print(f"{'layout':<20} {'bytes/rank':>11} {'vs DDP':>7} {'tokens/s':>9} {'loss':>7}")
    baseline = None
    for name, (layout, flags) in LAYOUTS.items():
        held, rate, loss = measure(layout, flags, args)
        baseline = baseline or held
        print(f"{name:<20} {held:>11,.0f} {held / baseline:>7.3f} {rate:>9,.0f} {loss:>7.3f}")


if __name__ == "__main__":
    main()
