"""Migration 0016: stored specs that relied on the implicit GPU (before a spec without
``resources.gpus`` held none) keep it; specs that said how many GPUs are left alone."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import text

from aicluster.core import Tenant, jobspec_from_mapping
from aicluster.store import Store


def test_stored_specs_without_a_gpu_count_keep_the_one_gpu_they_held(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    store.create_tenant(Tenant("a"), "admin")
    specs = {
        "old": {"name": "old", "entrypoint": "t.py"},
        "old-cpus": {"name": "old-cpus", "entrypoint": "t.py", "resources": {"cpus": 4.0}},
        "cpu-only": {"name": "cpu-only", "entrypoint": "t.py", "resources": {"gpus": 0}},
        "eight": {"name": "eight", "entrypoint": "t.py", "resources": {"gpus": 8}},
    }
    ids = {
        name: store.submit_job("a", jobspec_from_mapping(spec), "test")[0].id
        for name, spec in specs.items()
    }
    store.create_pipeline(
        "a", "p", {"name": "p", "job": {"name": "j", "entrypoint": "t.py"}}, {}, "test"
    )
    with store.engine.begin() as connection:  # the rows as the older code wrote them
        for name, job_id in ids.items():
            connection.execute(
                text("UPDATE jobs SET spec = :spec WHERE id = :id"),
                {"spec": json.dumps(specs[name]), "id": job_id},
            )
        connection.execute(text("UPDATE alembic_version SET version_num = '0015'"))
    store.close()

    store = Store.open(tmp_path)  # migrates to head
    gpus = {name: store.get_job("a", job_id).spec.resources for name, job_id in ids.items()}
    assert {name: r.gpus for name, r in gpus.items()} == {
        "old": 1, "old-cpus": 1, "cpu-only": 0, "eight": 8
    }  # fmt: skip
    assert gpus["old-cpus"].cpus == 4.0
    assert store.get_pipeline("a", "p").spec["job"]["resources"] == {"gpus": 1}
    store.close()
