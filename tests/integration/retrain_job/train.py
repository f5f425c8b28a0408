"""A pipeline's training job: fits nothing much (the point is the loop, not the fit), but takes
from its dataset ``rows`` (``rows.json``: ``{"x": [...], "config": {...}}``) what a real one
would: the drift reference of its inputs (2 quantile bins of ``x``) and its settings (a
``fail_rate`` makes a bad model), then exports the MLP of ``mlp.py``."""

import json
from pathlib import Path

import torch

from aicluster import train
from aicluster.train.export import export_model, numeric_reference

rows = json.loads((train.dataset("rows") / "rows.json").read_text())
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
export_model(
    net,
    entrypoint="mlp.py:load",
    config={"inputs": 8, "hidden": 16, "outputs": 2, **rows.get("config", {})},
    metrics={"rows": float(len(rows["x"]))},
    drift=numeric_reference(rows["x"], bins=2, feature="x"),
    code_dir=Path(__file__).parent,
)
print(f"exported a model of {len(rows['x'])} rows", flush=True)
