"""Registered model versions without weights, for tests that route traffic but never load them."""

from __future__ import annotations

import json
from pathlib import Path

from aicluster.store import Store

META = {"format": 1, "entrypoint": "m.py:load", "config": {}, "metrics": {}}


def register_stubs(store: Store, tenant: str, name: str, work_dir: Path, count: int) -> None:
    """Register versions 1..count of ``tenant``'s ``name`` (one fake job each)."""
    for index in range(1, count + 1):
        source = work_dir / f"stub-{tenant}-{name}-{index}"
        source.mkdir(parents=True)
        (source / "model.json").write_text(json.dumps(META))
        store.register_model_version(
            tenant, name, source_dir=source, job_id=f"j-{name}-{index}", spec_hash=None,
            code_version="c" * 64, dataset_hash=None, metrics={}, registered_by="alice",
        )  # fmt: skip
