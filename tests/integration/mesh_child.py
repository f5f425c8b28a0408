"""A rank of the mesh test (test_train_mesh.py): builds ``train.mesh()``, shards a small MLP
with tensor parallelism over ``tp`` and FSDP2 over ``dp``, trains a few steps, reports how much
of the model it holds, and writes where it sits in the mesh (``mesh-<rank>.json`` beside its
telemetry file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import aicluster.train as train

FEATURES, HIDDEN = 8, 32


def main() -> None:
    ctx = train.init()
    mesh = train.mesh()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, FEATURES))
    whole = sum(p.numel() for p in model.parameters())
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(1, 4):
        x = torch.randn(4, FEATURES, generator=torch.Generator().manual_seed(step))
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        held = sum(p.to_local().numel() for p in model.parameters())  # type: ignore[attr-defined]
        train.report(step, loss=loss.item(), held=held, whole=whole)
    coordinate = mesh.get_coordinate() or []
    layout = {
        "names": list(mesh.mesh_dim_names or ()),
        "shape": list(mesh.shape),
        "coordinate": list(coordinate),
        "tp": [int(r) for r in mesh["tp"].mesh.flatten().tolist()],
        "dp": [int(r) for r in mesh["dp"].mesh.flatten().tolist()],
    }
    folder = Path(os.environ["AICLUSTER_TELEMETRY_FILE"]).parent
    (folder / f"mesh-{ctx.rank}.json").write_text(json.dumps(layout))
    train.shutdown()


if __name__ == "__main__":
    main()
