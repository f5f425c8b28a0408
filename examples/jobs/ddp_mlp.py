"""DDP on a synthetic regression task: the smallest real distributed job.

Each rank draws its own shard of a dataset made here from a seed (no files), trains a small MLP
wrapped in ``DistributedDataParallel`` (gloo on CPU, NCCL on GPUs) and reports its loss every
step through ``aicluster.train``. Every ``--checkpoint-every`` steps it saves a checkpoint (into
the job's checkpoint directory, or ``--checkpoint-dir``) and at start it resumes from the latest
one, so a restarted attempt continues where the last one stopped; a batch depends only on
(seed, rank, step), so a resumed run is bit-identical to an uninterrupted one. Asked to stop
(SIGTERM from the runtime), it checkpoints and exits 0. When training completes, rank 0 exports
the model for serving (:func:`load_for_serving`: ``{"x": [8 numbers] or a list of them}`` →
``{"y": [...]}``; the drift reference is the quantiles of the training inputs). Runs under the
aicluster runtime, under ``torchrun``, or alone: ``python examples/jobs/ddp_mlp.py --steps 50``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import aicluster.train as train


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="slow each step (tests)")
    parser.add_argument("--fail-rank", type=int, default=-1, help="exit 3 on this rank (tests)")
    parser.add_argument("--fail-step", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps; 0: never")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="default: the job's")
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument(
        "--checkpoint-writer",
        choices=("auto", "thread", "process"),
        default="auto",
        help="who writes an asynchronous checkpoint: a thread, DCP's checkpoint process, or "
        "auto (the process on a GPU host, else the thread)",
    )
    parser.add_argument("--deterministic", action="store_true", help="deterministic kernels")
    parser.add_argument("--export-dir", type=Path, default=None, help="default: the job's")
    return parser.parse_args(argv)


def make_data(seed: int, samples: int, features: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """y = sin(x · w / √features) + noise, the same for every rank given the seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    y = torch.sin(x @ w / features**0.5) + 0.05 * torch.randn(samples, 1, generator=generator)
    return x, y


def batch_generator(seed: int, rank: int, step: int) -> torch.Generator:
    """The generator of one rank's batch at one step: data order is a function of the step."""
    return torch.Generator().manual_seed((seed * 1_000_003 + rank) * 1_000_003 + step)


def make_model(features: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.Tanh(),
        nn.Linear(hidden, hidden),
        nn.Tanh(),
        nn.Linear(hidden, 1),
    )


class Regressor:
    """The served model: ``{"x": [f numbers] or [[f numbers], ...]}`` → ``{"y": [...]}``."""

    def __init__(self, model: nn.Module, features: int) -> None:
        self.model, self.features = model, features

    def predict(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Raises ``ValueError`` unless ``x`` is one row or a list of rows of numbers."""
        rows = inputs.get("x")
        if isinstance(rows, list) and rows and not isinstance(rows[0], list):
            rows = [rows]
        ok = isinstance(rows, list) and 0 < len(rows) <= 1024
        if not ok or not all(_numbers(row, self.features) for row in rows):  # type: ignore[union-attr]
            raise ValueError(f"'x' must be a row of {self.features} numbers or 1-1024 such rows")
        with torch.inference_mode():
            y = self.model(torch.tensor(rows, dtype=torch.float32))
        return {"y": y.squeeze(1).tolist()}


def _numbers(row: Any, count: int) -> bool:
    return (
        isinstance(row, list)
        and len(row) == count
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in row)
    )


def load_for_serving(weights: dict[str, torch.Tensor], config: dict[str, Any]) -> Regressor:
    """The serving entrypoint (``model.json``'s ``ddp_mlp.py:load_for_serving``)."""
    model = make_model(int(config["features"]), int(config["hidden"]))
    model.load_state_dict(weights)
    model.eval()
    return Regressor(model, int(config["features"]))


def export_for_serving(
    model: nn.Module, args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, loss: float
) -> Path | None:
    """Rank 0, after the last step; ``x`` and ``y`` are the whole (unsharded) dataset."""
    if args.export_dir is None and train.context().checkpoint_dir is None:
        return None  # a plain run outside aicluster exports only when asked
    from aicluster.train import export  # only a run that completes exports

    data = hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()
    return export.export_model(
        model,
        entrypoint="ddp_mlp.py:load_for_serving",
        config={"features": x.shape[1], "hidden": args.hidden},
        metrics={"loss": loss},
        dataset_hash=data,
        drift=export.numeric_reference(x.flatten().tolist(), feature="x"),
        directory=args.export_dir,
    )


def checkpointer(args: argparse.Namespace, ctx: train.Context) -> train.Checkpointer | None:
    directory = args.checkpoint_dir or ctx.checkpoint_dir
    if args.checkpoint_every <= 0 or directory is None:
        return None
    writer = True if args.checkpoint_writer == "auto" else args.checkpoint_writer
    return train.Checkpointer(directory, keep_last=args.keep_last, async_save=writer)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    ctx = train.init()
    print(
        f"rank {ctx.rank}/{ctx.world_size} local {ctx.local_rank} on node {ctx.node} "
        f"pid {os.getpid()} backend {ctx.backend} device {ctx.device}",
        flush=True,
    )
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts)
    full_x, full_y = make_data(args.seed, 4096)
    shard = slice(ctx.rank, None, ctx.world_size)
    x, y = full_x[shard].to(ctx.device), full_y[shard].to(ctx.device)
    model = make_model(x.shape[1], args.hidden).to(ctx.device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    ckpt = checkpointer(args, ctx)
    resumed = ckpt.load(model=ddp, optimizer=optimizer) if ckpt else None
    if resumed and train.is_main():
        print(f"resumed from step {resumed.step} ({resumed.path})", flush=True)
    last_step = resumed.step if resumed else 0
    for step in range(resumed.step + 1 if resumed else 1, args.steps + 1):
        if step == args.fail_step and ctx.rank == args.fail_rank:
            print(f"rank {ctx.rank}: failing on purpose at step {step}", file=sys.stderr)
            return 3
        batches = batch_generator(args.seed, ctx.rank, step)
        index = torch.randint(0, x.shape[0], (args.batch_size,), generator=batches)
        loss = nn.functional.mse_loss(ddp(x[index]), y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        train.report(step, loss=loss.item(), samples=args.batch_size)
        last_step = step
        if train.is_main() and (step % 20 == 0 or step == 1):
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        stopping = train.should_stop()  # collective: every rank stops after the same step
        if ckpt and (stopping or step % args.checkpoint_every == 0 or step == args.steps):
            samples = step * args.batch_size * ctx.world_size
            ckpt.save(step, model=ddp, optimizer=optimizer, extra={"samples_seen": samples})
        if stopping:
            if train.is_main():
                print(f"stop requested: stopping after step {step}", flush=True)
            break
    if ckpt:
        ckpt.close()  # waits for the last save
    if last_step >= args.steps and train.is_main():
        with torch.no_grad():
            final = nn.functional.mse_loss(model(full_x.to(ctx.device)), full_y.to(ctx.device))
        print(f"final loss {final.item():.6f} on the whole dataset", flush=True)
        export_for_serving(model, args, full_x, full_y, final.item())
    train.barrier()
    if train.is_main():
        print("done", flush=True)
    train.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
