"""A test job that knows nothing of aicluster: plain DDP on gloo, ``--steps`` steps; rank
``--slow-rank`` sleeps ``--sleep`` seconds per step before its forward pass (a straggler)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--sleep", type=float, default=0.2)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.randn(64, 32)
for _ in range(args.steps):
    if rank == args.slow_rank:
        time.sleep(args.sleep)
    loss = model(data).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.barrier()
print(f"rank {rank} done after {args.steps} steps, loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
print(f"pid {os.getpid()}", flush=True)
