"""A tiny character-level GPT trained with DDP on a text that ships in the repository.

Small enough for a 2-core machine (two layers, 64 wide, 64-character context): the loss falls
from ln(vocabulary) ≈ 4 to about 2 in a few hundred steps. Each rank samples its own batches
(a function of seed, rank and step), gradients are averaged by ``DistributedDataParallel`` (gloo
on CPU, NCCL on GPUs), and every step is reported through ``aicluster.train``. It checkpoints
every ``--checkpoint-every`` steps, resumes from the latest checkpoint at start, and on a stop
request (SIGTERM) checkpoints and exits 0. When training completes, rank 0 exports the model for
serving (:mod:`aicluster.train.export`: safetensors weights, this script, the vocabulary and the
text's character frequencies as the drift reference); :func:`load_for_serving` is the entrypoint
that serves it: ``{"prompt": str, "max_new_tokens": int} -> {"completion": str}``, greedy.
Standalone: ``python examples/jobs/tiny_gpt.py --steps 100 [--export-dir DIR]``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import aicluster.train as train

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "data" / "coriolanus.txt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per rank")
    parser.add_argument("--block", type=int, default=64, help="context length")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps; 0: never")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="default: the job's")
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--export-dir", type=Path, default=None, help="default: the job's")
    return parser.parse_args(argv)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(block, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tokens(idx) + self.positions(positions)
        return self.head(self.norm(self.blocks(x)))


def batch(
    data: torch.Tensor, size: int, block: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, len(data) - block - 1, (size,), generator=generator)
    x = torch.stack([data[s : s + block] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + block + 1] for s in starts.tolist()])
    return x, y


@torch.no_grad()
def evaluate(model: nn.Module, data: torch.Tensor, args: argparse.Namespace) -> float:
    generator = torch.Generator().manual_seed(args.seed)  # the same batches every time
    losses = []
    for _ in range(4):
        x, y = batch(data, args.batch_size, args.block, generator)
        logits = model(x)
        losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    return sum(losses) / len(losses)


def batch_generator(seed: int, rank: int, step: int) -> torch.Generator:
    """The generator of one rank's batch at one step, so a resumed run sees the same data."""
    return torch.Generator().manual_seed((seed * 1_000_003 + rank) * 1_000_003 + step)


def checkpointer(args: argparse.Namespace, ctx: train.Context) -> train.Checkpointer | None:
    directory = args.checkpoint_dir or ctx.checkpoint_dir
    if args.checkpoint_every <= 0 or directory is None:
        return None
    return train.Checkpointer(directory, keep_last=args.keep_last)


def export_for_serving(
    model: TinyGPT, args: argparse.Namespace, text: str, vocab: list[str], metrics: dict[str, float]
) -> Path | None:
    """Rank 0, after the last step: the model, its config and lineage, for the registry."""
    ctx = train.context()
    if args.export_dir is None and ctx.checkpoint_dir is None:
        return None  # a plain run outside aicluster exports only when asked
    from aicluster.train import export  # only a run that completes exports

    config = {
        "vocab": "".join(vocab),
        "block": args.block,
        "width": args.width,
        "layers": args.layers,
        "heads": args.heads,
    }
    return export.export_model(
        model,
        entrypoint="tiny_gpt.py:load_for_serving",
        config=config,
        metrics=metrics,
        dataset_hash=export.file_sha256(args.data),
        drift=export.categorical_reference(text, vocab, feature="prompt"),
        directory=args.export_dir,
    )


class Completer:
    """The served model: greedy completion of a prompt, one character at a time."""

    def __init__(self, model: TinyGPT, vocab: str, block: int) -> None:
        self.model, self.vocab, self.block = model, vocab, block
        self.index = {ch: i for i, ch in enumerate(vocab)}

    def predict(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """``{"prompt": str, "max_new_tokens": 1..256 (32)}`` → ``{"completion": str}``.

        Raises ``ValueError`` for a missing or empty prompt, characters outside the training
        text's vocabulary, or a bad ``max_new_tokens``.
        """
        prompt, count = inputs.get("prompt"), inputs.get("max_new_tokens", 32)
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("'prompt' must be a non-empty string")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 256:
            raise ValueError("'max_new_tokens' must be an integer from 1 to 256")
        unknown = sorted({ch for ch in prompt if ch not in self.index})
        if unknown:
            raise ValueError(f"'prompt' has characters outside the vocabulary: {unknown!r}")
        idx = torch.tensor([[self.index[ch] for ch in prompt[-self.block :]]])
        out: list[str] = []
        with torch.inference_mode():
            for _ in range(count):
                next_id = int(self.model(idx[:, -self.block :])[0, -1].argmax())
                out.append(self.vocab[next_id])
                idx = torch.cat([idx, torch.tensor([[next_id]])], dim=1)
        return {"completion": "".join(out)}


def load_for_serving(weights: dict[str, torch.Tensor], config: dict[str, Any]) -> Completer:
    """The serving entrypoint (``model.json``'s ``tiny_gpt.py:load_for_serving``)."""
    vocab = str(config["vocab"])
    model = TinyGPT(
        len(vocab),
        int(config["block"]),
        int(config["width"]),
        int(config["layers"]),
        int(config["heads"]),
    )
    model.load_state_dict(weights)
    model.eval()
    return Completer(model, vocab, int(config["block"]))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    ctx = train.init()
    text = args.data.read_text(encoding="utf-8")
    vocab = sorted(set(text))
    encoded = torch.tensor([vocab.index(ch) for ch in text], dtype=torch.long)
    split = int(0.9 * len(encoded))
    train_data, val_data = encoded[:split], encoded[split:]
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = TinyGPT(len(vocab), args.block, args.width, args.layers, args.heads).to(ctx.device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    ckpt = checkpointer(args, ctx)
    resumed = ckpt.load(model=ddp, optimizer=optimizer) if ckpt else None
    if train.is_main():
        params = sum(p.numel() for p in model.parameters())
        print(
            f"tiny_gpt: {params} parameters, vocabulary {len(vocab)} (ln = "
            f"{math.log(len(vocab)):.2f}), {len(text)} characters, world {ctx.world_size}, "
            f"backend {ctx.backend}",
            flush=True,
        )
    print(f"rank {ctx.rank} on node {ctx.node}", flush=True)
    if resumed and train.is_main():
        print(f"resumed from step {resumed.step} ({resumed.path})", flush=True)
    tokens = args.batch_size * args.block
    last_step, last_loss = (resumed.step if resumed else 0), float("nan")
    for step in range(resumed.step + 1 if resumed else 1, args.steps + 1):
        lr = args.lr * min(1.0, step / 20) * (0.1 + 0.9 * (1 - step / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        generator = batch_generator(args.seed, ctx.rank, step)
        x, y = batch(train_data, args.batch_size, args.block, generator)
        logits = ddp(x.to(ctx.device))
        loss = F.cross_entropy(logits.flatten(0, 1), y.to(ctx.device).flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        metrics = {"lr": lr, "tokens": float(tokens)}
        if train.is_main() and (step % args.log_every == 0 or step in (1, args.steps)):
            metrics["val_loss"] = evaluate(model, val_data.to(ctx.device), args)
            print(
                f"step {step:4d}  loss {loss.item():.3f}  val {metrics['val_loss']:.3f}",
                flush=True,
            )
        train.report(step, loss=loss.item(), samples=args.batch_size, **metrics)
        last_step, last_loss = step, loss.item()
        stopping = train.should_stop()  # collective: every rank stops after the same step
        if ckpt and (stopping or step % args.checkpoint_every == 0 or step == args.steps):
            seen = step * tokens * ctx.world_size
            ckpt.save(step, model=ddp, optimizer=optimizer, extra={"tokens_seen": seen})
        if stopping:
            if train.is_main():
                print(f"stop requested: stopping after step {step}", flush=True)
            break
    if ckpt:
        ckpt.close()  # waits for the last save
    if last_step >= args.steps and train.is_main():
        final = {"val_loss": evaluate(model, val_data.to(ctx.device), args)}
        if math.isfinite(last_loss):
            final["loss"] = last_loss
        exported = export_for_serving(model, args, text, vocab, final)
        if exported is not None:
            print(f"exported the model to {exported}", flush=True)
    train.barrier()
    train.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
