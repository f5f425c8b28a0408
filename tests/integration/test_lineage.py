"""Lineage end to end through a real API server and store (SQLite and PostgreSQL): a model
version names the dataset versions its job read (with their manifests' hashes, from what was
recorded at submit, not from what the job's export claims), its spec, code, configuration and
parent; a dataset version names the models trained on it; a deleted one shows as deleted; and
another tenant sees none of it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from apiserver import RunningServer, serve_tenants
from modelkit import DATASET, job_export_dir, write_export
from typer.testing import CliRunner

from aicluster.cli.main import app as cli_app
from aicluster.core import JobState, Node, Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

SHARD = b"lineage data"
MANIFEST = {
    "format": 1,
    "files": [{"path": "rows.txt", "size": len(SHARD), "pieces": [[0, 0, len(SHARD)]]}],
    "shards": [{"sha256": hashlib.sha256(SHARD).hexdigest(), "size": len(SHARD)}],
}
SPEC = {
    "name": "trainer",
    "module": "train",
    "resources": {"gpus": 1, "gpu_type": "H100"},
    "model": {"name": "clf"},
    "data": ["rows:latest"],
}


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve_tenants(
        module_store_url,
        tmp_path_factory.mktemp("state"),
        [Tenant(name, quota={"H100": 8}) for name in ("a", "b")],
        {"alice": ("a", Role.MEMBER), "ada": ("a", Role.ADMIN), "bob": ("b", Role.MEMBER)},
        [Node("node-0", 8, "H100", "rack-0", "pod-0")],
    ) as running:
        yield running


def push(server: RunningServer, who: str, tenant: str) -> dict[str, Any]:
    with server.client(who) as client:
        for shard in MANIFEST["shards"]:
            path = f"/v1/tenants/{tenant}/datasets/shards/{shard['sha256']}"
            assert client.post(path, content=SHARD).status_code in (200, 201)
        answer = client.post(f"/v1/tenants/{tenant}/datasets/rows/versions", json=MANIFEST)
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def train(server: RunningServer, who: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Submit through the API (data resolved and recorded there), succeed, register."""
    store, state_dir = server.plane.store, server.plane.settings.state_dir
    with server.client(who) as client:
        submitted = client.post("/v1/jobs", json=spec)
        assert submitted.status_code == 201, submitted.text
        job_id = submitted.json()["id"]
        for state in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
            store.transition(job_id, state, "test")
        write_export(job_export_dir(state_dir, job_id))
        answer = client.post(
            f"/v1/models/{spec['model']['name']}/versions", json={"job_id": job_id}
        )
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_version_names_what_its_job_read_and_a_dataset_names_its_models(
    server: RunningServer,
) -> None:
    first = push(server, "alice", "a")
    v1 = train(server, "alice", {**SPEC, "tenant": "a"})
    (use,) = v1["datasets"]
    assert (use["name"], use["version"], use["deleted"]) == ("rows", first["version"], False)
    # The recorded input's manifest hash, not the hash the job's export claims.
    assert use["manifest_sha256"] == first["manifest_sha256"] != DATASET
    assert v1["spec"]["data"] == [f"rows:{first['version']}"] and v1["config"] == {"features": 3}
    assert v1["parent"] is None and v1["traffic"] is None
    # A newer dataset version and a child of v1: its lineage names both.
    second = push(server, "alice", "a")
    assert second["version"] == first["version"] + 1
    child = {**SPEC, "tenant": "a", "model": {"name": "clf", "parent": v1["ref"]}}
    v2 = train(server, "alice", child)
    assert v2["parent"] == v1["ref"]
    assert [d["ref"] for d in v2["datasets"]] == [f"rows:{second['version']}"]
    with server.client("alice") as alice:
        shown = alice.get(f"/v1/tenants/a/datasets/rows/versions/{first['version']}").json()
        newest = alice.get("/v1/tenants/a/datasets/rows/versions/latest").json()
        missing = alice.post(
            "/v1/jobs", json={**child, "model": {"name": "clf", "parent": "clf:9"}}
        )
    assert shown["models"] == [v1["ref"]] and newest["models"] == [v2["ref"]]
    assert missing.status_code == 400 and "clf:9" in missing.json()["error"]


def test_a_deleted_dataset_version_shows_as_deleted_and_only_an_admin_may_delete_it(
    server: RunningServer,
) -> None:
    with server.client("alice") as alice:
        (version,) = [v for v in alice.get("/v1/models/clf").json() if v["version"] == 1]
        ref = version["datasets"][0]
        path = f"/v1/tenants/a/datasets/rows/versions/{ref['version']}"
        refused = alice.delete(path)
    assert refused.status_code == 403 and "clf:1" in refused.json()["error"]
    with server.client("ada") as ada:
        assert ada.delete(path).status_code == 204
    with server.client("alice") as alice:
        after = alice.get("/v1/models/clf/versions/1").json()
    (gone,) = after["datasets"]
    assert gone["deleted"] is True and gone["manifest_sha256"] == ref["manifest_sha256"]


def test_another_tenant_sees_no_lineage(server: RunningServer) -> None:
    with server.client("bob") as bob:
        assert bob.get("/v1/models/clf/versions/1").status_code == 404
        assert bob.get("/v1/models/clf/versions/1", params={"tenant": "a"}).status_code == 404
        assert bob.get("/v1/tenants/a/datasets/rows/versions/latest").status_code == 404
        # Its own dataset of the same name names none of a's models.
        push(server, "bob", "b")
        own = bob.get("/v1/tenants/b/datasets/rows/versions/latest").json()
    assert own["models"] == []


def test_model_show_draws_the_chain_and_data_show_names_the_models(
    server: RunningServer,
) -> None:
    target = ["--url", server.url, "--token", server.tokens["alice"]]
    runner = CliRunner()
    shown = runner.invoke(cli_app, ["model", "show", "clf:1", *target], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    chain = [next(i for i, line in enumerate(lines) if key in line)
             for key in ("dataset rows:", "── job", "── model clf:1", "not deployed")]  # fmt: skip
    assert chain == sorted(chain) and "(deleted)" in lines[chain[0]]
    data = runner.invoke(cli_app, ["data", "show", "rows:latest", *target])
    assert data.exit_code == 0, data.output
    assert "clf:2" in data.output
