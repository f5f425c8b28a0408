"""Helpers for registry tests: a real exported artifact and a job that succeeded."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch
from torch import nn

from aicluster.core import JobState, jobspec_from_mapping
from aicluster.runtime import RunDir
from aicluster.store import JobRecord, Store
from aicluster.train.export import export_model

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn


    class Linear:
        def __init__(self, weights, config):
            self.model = nn.Linear(config["features"], 1)
            self.model.load_state_dict(weights)

        def predict(self, inputs):
            x = inputs.get("x")
            if not isinstance(x, list) or len(x) != 3:
                raise ValueError("'x' must be a list of 3 numbers")
            with torch.no_grad():
                return {"y": self.model(torch.tensor([x], dtype=torch.float32)).item()}


    def load(weights, config):
        return Linear(weights, config)
    """
)
DATASET = "d" * 64


def write_export(directory: Path, loss: float = 0.5) -> Path:
    """A real artifact (safetensors weights, model.json, code/linear.py) at ``directory``."""
    code = directory.parent / f".code-{directory.name}"
    code.mkdir(parents=True, exist_ok=True)
    (code / "linear.py").write_text(SCRIPT)
    torch.manual_seed(0)
    return export_model(
        nn.Linear(3, 1),
        entrypoint="linear.py:load",
        config={"features": 3},
        metrics={"loss": loss},
        dataset_hash=DATASET,
        directory=directory,
        code_dir=code,
    )


def succeeded_job(store: Store, tenant: str, name: str = "train", user: str = "alice") -> JobRecord:
    """A job of ``tenant`` that went PENDING → STARTING → RUNNING → SUCCEEDED."""
    spec = jobspec_from_mapping({"name": name, "entrypoint": "t.py", "resources": {"gpus": 0}})
    job, _ = store.submit_job(tenant, spec, user)
    for state in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
        job = store.transition(job.id, state, "test")
    return job


def job_export_dir(state_dir: Path, job_id: str) -> Path:
    """The job's export directory, made as a launch makes it (the tenant's name only places it)."""
    run = RunDir(state_dir, job_id, 0)
    run.make_data_dir("exporting-tenant", None)
    return run.export_dir
