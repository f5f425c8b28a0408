"""How much an asynchronous checkpoint slows a training loop, against a synchronous one.

An MLP with a few hundred MB of state (weights + Adam's two moments) trains with a steady step
time. The loop is cut into periods of K steps, each starting with a synchronous save, an
asynchronous save by the default writer, or none (both savers are
``aicluster.train.Checkpointer``: same DCP writer, fsync, atomic commit and pruning; the process
is a world of one, as a job's is, so the default writer is DCP's checkpoint process where CUDA
is available and a thread elsewhere); ``--also`` adds other writers. An async period ends by
waiting for its write, so an unfinished write counts against it. Periods of all kinds
alternate, so a shared machine's slow drifts hit them alike. The stall of a save is, per round,
its period minus the same round's period without a save (a paired difference: the machine's
speed drifts between rounds, hardly within one), and its median over the rounds, with the
quartiles as the spread; the figure of merit is the async stall as a share of the sync stall
(target ≤ 10%). Also printed, as they hardly depend on what else runs on the machine: how long
``save()`` blocks the loop, and the CPU time a period with a save costs beyond one without (the
writer's work: on a machine with a spare core it runs beside the loop; on a saturated one it
comes out of the loop's share). Prints figures, asserts nothing::

    python bench/checkpoint_stall.py [--width 1024 --layers 24 --every 20 --rounds 5]
    python bench/checkpoint_stall.py --device cuda --width 4096 --layers 8 --batch 2048 \
        --every 150 --rounds 5 --threads 4 --also process   # on a GPU host
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from aicluster.train import Checkpointer

MODES = ("none", "sync", "async")
#: Optional further kinds (``--also``): other writers of an asynchronous save, each a
#: ``Checkpointer`` configuration and a note for the report. "async" is the default writer.
EXTRA: dict[str, tuple[dict[str, object], str]] = {
    # DCP's checkpoint process writes (the loop process's CPU time only is counted).
    "process": ({"async_save": "process"}, " (CPU s: the loop process's only)"),
    # The thread writer, the state copied beside the next step (waited for before it changes).
    "overlap": ({"async_save": True, "overlap_copy": True}, " (the copy beside the next step)"),
    "process-copy-in-save": (
        {"async_save": "process", "overlap_copy": False},
        " (the process writer, the copy taken inside save())",
    ),
}


@dataclass
class Figures:
    periods: list[float] = field(default_factory=list)  # seconds per period of K steps
    cpu: list[float] = field(default_factory=list)  # process CPU seconds per period
    calls: list[float] = field(default_factory=list)  # seconds each save() call blocked


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--every", type=int, default=20, help="steps per period (K)")
    parser.add_argument("--rounds", type=int, default=5, help="periods of each kind")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the loop")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a real disk)")
    parser.add_argument("--device", default="cpu", help="where the model trains (cpu, cuda)")
    parser.add_argument(
        "--also", default="", help=f"comma-separated further kinds: {', '.join(EXTRA)}"
    )
    parser.add_argument("--process", action="store_true", help="the same as --also process")
    args = parser.parse_args()
    args.also = [kind for kind in args.also.split(",") if kind]
    if args.process and "process" not in args.also:
        args.also.append("process")
    unknown = [kind for kind in args.also if kind not in EXTRA]
    if unknown:
        parser.error(f"unknown kinds {unknown}; known: {', '.join(EXTRA)}")
    return args


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    loss = model(x).square().mean()
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    optimizer.step()


def run_period(
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    ckpt: Checkpointer | None,
    every: int,
    figures: Figures,
) -> None:
    """K steps, the first followed by a save (unless ``ckpt`` is None); the write waited for."""
    began, cpu = time.perf_counter(), time.process_time()
    for offset in range(every):
        train_step(model, optimizer, x)
        if ckpt is not None and offset == 0:
            called = time.perf_counter()
            ckpt.save(step, model=model, optimizer=optimizer)
            figures.calls.append(time.perf_counter() - called)
    if ckpt is not None:
        ckpt.wait()
    if x.is_cuda:  # the GPU's queue of work belongs to this period
        torch.cuda.synchronize()
    figures.periods.append(time.perf_counter() - began)
    figures.cpu.append(time.process_time() - cpu)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.state_dict().values())
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(args.layers)))
    model.to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    x = torch.randn(args.batch, args.width, device=args.device)
    for _ in range(3):
        train_step(model, optimizer, x)
    modes = MODES + tuple(args.also)
    # A world of one, as every job under the runtime has: the default writer is chosen by it
    # (DCP's checkpoint process where there is a GPU), and the process joins a group of its own.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    figures = {mode: Figures() for mode in modes}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ckpt-bench-") as scratch:
        checkpointers = {
            "none": None,
            "sync": Checkpointer(Path(scratch) / "sync", keep_last=2, async_save=False),
            "async": Checkpointer(Path(scratch) / "async", keep_last=2, async_save=True),
        }
        for kind in args.also:
            options = EXTRA[kind][0]
            checkpointers[kind] = Checkpointer(Path(scratch) / kind, keep_last=2, **options)  # type: ignore[arg-type]
        for ckpt in checkpointers.values():  # warm up: staging buffers, files, lazy imports
            if ckpt is not None:
                ckpt.save(0, model=model, optimizer=optimizer)
                ckpt.wait()
        for round_ in range(args.rounds):
            shift = round_ % len(modes)
            order = modes[shift:] + modes[:shift]
            for index, mode in enumerate(order):
                step = (round_ * len(modes) + index + 1) * args.every
                run_period(
                    step, model, optimizer, x, checkpointers[mode], args.every, figures[mode]
                )
        for ckpt in checkpointers.values():
            if ckpt is not None:
                ckpt.close()
        writer = checkpointers["async"].mode  # type: ignore[union-attr]
        report(args, model, optimizer, figures, Path(scratch), writer)


def report(
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    figures: dict[str, Figures],
    scratch: Path,
    writer: str,
) -> None:
    modes = tuple(figures)
    period = {mode: statistics.median(f.periods) for mode, f in figures.items()}
    paired = {mode: paired_stalls(figures[mode], figures["none"]) for mode in modes}
    stall = {mode: statistics.median(paired[mode]) for mode in modes}
    print(f"command: python {shlex.join(sys.argv)}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, "
        f"torch {torch.__version__}, {args.threads} loop thread(s), training on {args.device}"
        f"{' (' + torch.cuda.get_device_name() + ')' if args.device.startswith('cuda') else ''}; "
        f"writing to {scratch.parent}"
    )
    print(
        f"state: {state_bytes(model, optimizer) / 2**20:.0f} MiB (weights + Adam moments); "
        f"step {period['none'] / args.every * 1000:.0f} ms; periods of {args.every} steps, "
        f"{args.rounds} of each kind (medians)"
    )
    cpu = {mode: statistics.median(f.cpu) for mode, f in figures.items()}
    print(
        f"{'save':<20} {'period s':>9} {'stall s':>8} {'stall quartiles':>16} "
        f"{'save() blocks s':>16} {'CPU s':>7}"
    )
    for mode in modes:
        calls = f"{statistics.median(figures[mode].calls):>16.3f}" if figures[mode].calls else ""
        stalled, spread, used = "", "", ""
        if mode != "none":
            low, _, high = statistics.quantiles(paired[mode], n=4)
            stalled, spread = f"{stall[mode]:>8.3f}", f"{low:.3f}..{high:.3f}"
            used = f"{cpu[mode] - cpu['none']:>7.3f}"
        print(f"{mode:<20} {period[mode]:>9.3f} {stalled:>8} {spread:>16} {calls:>16} {used:>7}")
    share = stall["async"] / stall["sync"] * 100 if stall["sync"] > 0 else float("nan")
    blocked = statistics.median(figures["async"].calls) / statistics.median(figures["sync"].calls)
    print(
        f"async ({writer}, the default writer) stall = {share:.1f}% of the sync stall "
        "(target <= 10%); "
        f"async save() blocks for {blocked * 100:.1f}% of a sync save()"
    )
    for extra, (_, note) in EXTRA.items():
        if extra in stall:
            share = stall[extra] / stall["sync"] * 100 if stall["sync"] > 0 else float("nan")
            blocked = statistics.median(figures[extra].calls) / statistics.median(
                figures["sync"].calls
            )
            print(
                f"{extra} stall = {share:.1f}% of the sync stall; its save() blocks for "
                f"{blocked * 100:.1f}% of a sync save(){note}"
            )
    print(
        "(stall: median over rounds of a period minus the same round's period without a save; "
        "CPU s: the same for CPU time)"
    )


def paired_stalls(saving: Figures, plain: Figures) -> list[float]:
    """Each round's period with a save minus that round's period without one."""
    return [
        with_save - without
        for with_save, without in zip(saving.periods, plain.periods, strict=True)
    ]


if __name__ == "__main__":
    main()
