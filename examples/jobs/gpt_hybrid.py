"""A small GPT trained with hybrid parallelism on the mesh the job's spec asks for.

``mesh = train.mesh()`` lays the ranks out as ``dp × pp × tp`` (the spec's ``parallelism:``):

- **tp**: each block's attention (query, key and value projections split by heads, the output
  projection by rows) and MLP (up by columns, down by rows) are tensor parallel
  (``parallelize_module``, PyTorch's DTensor plans), inside one NVLink domain on a real cluster;
- **dp**: FSDP2 (``fully_shard``) shards each block and the rest over the data-parallel ranks,
  each of which trains on its slice of the global batch;
- **pp**: with two or more stages the blocks are split into pipeline stages
  (``torch.distributed.pipelining``, a GPipe schedule over micro-batches).

The global batch of a step depends only on (seed, step), and the initial weights only on the
seed, so every layout trains the same model: a checkpoint (DCP, :class:`aicluster.train
.Checkpointer`) taken under one mesh resumes under another (``data=2,tensor=2`` →
``data=4`` → ``tensor=2``), and the losses continue as if uninterrupted. Gloo on CPU (simulated
GPUs), NCCL on GPUs. Reads the text that ships with the examples (``examples/data``).
Standalone: ``torchrun --nproc-per-node 4 examples/jobs/gpt_hybrid.py --tensor 2``.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import aicluster.train as train

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "data" / "coriolanus.txt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step, global")
    parser.add_argument("--micro-batches", type=int, default=2, help="per step, with pipelining")
    parser.add_argument("--block", type=int, default=32, help="context length")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--tensor", type=int, default=None, help="without the spec's degrees")
    parser.add_argument("--pipeline", type=int, default=None, help="without the spec's degrees")
    parser.add_argument(
        "--ddp", action="store_true", help="DDP instead of FSDP2 (data parallel only; a baseline)"
    )
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps; 0: never")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="default: the job's")
    parser.add_argument(
        "--state-digest",
        action="store_true",
        help="print a digest of the whole model and optimizer state after loading and saving",
    )
    return parser.parse_args(argv)


class Attention(nn.Module):
    """Causal self-attention with separate projections, so tensor parallelism splits heads."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_width = width // heads
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        # -1 heads: this rank's share of them under tensor parallelism, all of them without.
        q, k, v = (
            projection(x).view(batch, length, -1, self.head_width).transpose(1, 2)
            for projection in (self.query, self.key, self.value)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, length, -1))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


#: Each block's tensor-parallel plan (Megatron's: columns in, rows out; one all-reduce each).
BLOCK_PLAN = {
    "attention.query": ColwiseParallel(),
    "attention.key": ColwiseParallel(),
    "attention.value": ColwiseParallel(),
    "attention.out": RowwiseParallel(),
    "up": ColwiseParallel(),
    "down": RowwiseParallel(),
}


class GPT(nn.Module):
    """The whole model, or one pipeline stage of it: a stage keeps its own blocks (under their
    names in the whole model, so a checkpoint's keys do not depend on the layout), the first
    one the embeddings, the last one the final norm and the head."""

    def __init__(self, vocab: int, args: argparse.Namespace) -> None:
        super().__init__()
        self.tokens: nn.Module | None = nn.Embedding(vocab, args.width)
        self.positions: nn.Module | None = nn.Embedding(args.block, args.width)
        self.blocks = nn.ModuleDict(
            {str(i): Block(args.width, args.heads) for i in range(args.layers)}
        )
        self.norm: nn.Module | None = nn.LayerNorm(args.width)
        self.head: nn.Module | None = nn.Linear(args.width, vocab, bias=False)

    def keep_stage(self, stage: int, stages: int) -> None:
        names = list(self.blocks)
        per_stage = math.ceil(len(names) / stages)
        for name in names[: stage * per_stage] + names[(stage + 1) * per_stage :]:
            del self.blocks[name]
        if stage > 0:
            self.tokens = self.positions = None
        if stage < stages - 1:
            self.norm = self.head = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tokens is not None and self.positions is not None:
            x = self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        if self.norm is not None and self.head is not None:
            x = self.head(self.norm(x))
        return x


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def global_batch(
    data: torch.Tensor, args: argparse.Namespace, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch: the same sequences whatever the layout."""
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - args.block - 1, (args.batch_size,), generator=generator)
    x = torch.stack([data[s : s + args.block] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + args.block + 1] for s in starts.tolist()])
    return x, y


def build(vocab: int, args: argparse.Namespace, mesh: Any, device: torch.device) -> nn.Module:
    torch.manual_seed(args.seed)  # the whole model's weights, the same on every rank
    model = GPT(vocab, args)
    stages, stage = mesh["pp"].size(), mesh["pp"].get_local_rank()
    if stages > 1:
        model.keep_stage(stage, stages)
    model.to(device)
    if args.ddp:  # the baseline: every rank holds the whole model and optimizer
        if mesh["tp"].size() > 1 or stages > 1:
            raise SystemExit("--ddp is data parallel only: no tensor or pipeline degree")
        return DistributedDataParallel(model, process_group=mesh["dp"].get_group())
    for block in model.blocks.values():
        parallelize_module(block, mesh["tp"], BLOCK_PLAN)
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


class Trainer:
    """One step: this rank's data-parallel slice of the global batch, through the pipeline
    when there is one; returns the global batch's loss (the same on every rank)."""

    def __init__(self, model: nn.Module, mesh: Any, args: argparse.Namespace) -> None:
        self.model, self.mesh = model, mesh
        self.dp, self.dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
        self.stages, self.stage = mesh["pp"].size(), mesh["pp"].get_local_rank()
        self.schedule = None
        if self.stages > 1:
            from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

            device = next(model.parameters()).device
            group = mesh["pp"].get_group()
            stage = PipelineStage(model, self.stage, self.stages, device, group=group)
            self.schedule = ScheduleGPipe(stage, args.micro_batches, loss_fn=cross_entropy)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x[self.dp_rank :: self.dp], y[self.dp_rank :: self.dp]
        last = self.stage == self.stages - 1
        if self.schedule is None:
            loss = cross_entropy(self.model(x), y)
            loss.backward()
            local = loss.detach()
        else:
            losses: list[torch.Tensor] = []
            first = self.stage == 0
            self.schedule.step(*([x] if first else []), target=y if last else None, losses=losses)
            local = torch.stack(losses).mean().detach() if last else torch.zeros(())
        # The last stage's ranks hold their slice's loss (its tensor-parallel ranks alike).
        total = local.float() if last else torch.zeros(())
        dist.all_reduce(total)
        return float(total) / (self.dp * self.mesh["tp"].size())


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of parameters and optimizer state this rank holds (its shards only)."""

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    held = [local(p) for p in model.parameters()]
    held += [local(v) for state in optimizer.state.values() for v in state.values()]
    return sum(t.numel() * t.element_size() for t in held if isinstance(t, torch.Tensor))


def sharding(model: nn.Module) -> str:
    """What this rank holds of the model (a DTensor's numel is the whole parameter's), and how
    the first block's query weight is laid on the mesh: FSDP2's shard on dp, then tensor
    parallelism's on tp."""
    held = whole = 0
    for parameter in model.parameters():
        whole += parameter.numel()
        held += (parameter.to_local() if isinstance(parameter, DTensor) else parameter).numel()
    blocks = getattr(model, "blocks", None)
    query = blocks["0"].attention.query.weight if blocks is not None and "0" in blocks else None
    laid = ""
    if isinstance(query, DTensor):
        laid = f"; query weight {tuple(query.placements)} on {query.device_mesh.mesh_dim_names}"
    return f"sharding: holds {held} of {whole} parameter elements{laid}"


def state_digest(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """A digest of the whole model and optimizer state, gathered across the layout: equal
    under every mesh when the values are."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    tensors = {f"model.{k}": v for k, v in model_state.items()}
    for name, values in optim_state.get("state", {}).items():
        tensors.update({f"optim.{name}.{k}": v for k, v in values.items()})
    mine = {
        key: hashlib.sha256(torch.as_tensor(value).float().numpy().tobytes()).hexdigest()
        for key, value in tensors.items()
    }
    everyone: list[dict[str, str]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, mine)
    merged = {key: value for part in everyone for key, value in part.items()}
    return hashlib.sha256(repr(sorted(merged.items())).encode()).hexdigest()[:16]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    ctx = train.init()
    mesh = train.mesh(pipeline=args.pipeline, tensor=args.tensor)
    text = args.data.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(ch) for ch in text], dtype=torch.long)
    model = build(len(vocab), args, mesh, ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    trainer = Trainer(model, mesh, args)
    directory = args.checkpoint_dir or ctx.checkpoint_dir
    ckpt = None
    if args.checkpoint_every > 0 and directory is not None:
        ckpt = train.Checkpointer(directory, async_save=False)
    resumed = ckpt.load(model=model, optimizer=optimizer) if ckpt else None
    # Only once the optimizer has state: reading an empty one's state initializes it.
    digest = state_digest(model, optimizer) if args.state_digest and resumed else None
    if train.is_main():
        shape = dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True))
        print(f"gpt_hybrid: mesh {shape}, vocabulary {len(vocab)}", flush=True)
        print(sharding(model), flush=True)
        if resumed:
            print(f"resumed from step {resumed.step} state digest {digest}", flush=True)
    for step in range(resumed.step + 1 if resumed else 1, args.steps + 1):
        x, y = global_batch(data, args, step)
        loss = trainer.step(x.to(ctx.device), y.to(ctx.device))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train.report(
            step,
            loss=loss,
            samples=args.batch_size // trainer.dp,
            tokens=float(args.batch_size * args.block),  # the step's, all ranks together
            state_bytes=float(state_bytes(model, optimizer)),
        )
        if train.is_main():
            print(f"step {step} loss {loss:.6f}", flush=True)
        stopping = train.should_stop()
        if ckpt and (stopping or step % args.checkpoint_every == 0 or step == args.steps):
            ckpt.save(step, model=model, optimizer=optimizer)
            if args.state_digest:
                digest = state_digest(model, optimizer)
                if train.is_main():
                    print(f"saved step {step} state digest {digest}", flush=True)
        if stopping:
            break
    if ckpt:
        ckpt.close()
    train.barrier()
    train.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
