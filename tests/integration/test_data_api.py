"""Datasets through the API and the CLI on a real server and store (SQLite and PostgreSQL):
push (streamed shards, then the manifest), ls, show, rm, the data quota, retention, ``data:``
resolved at submit, and tenants that attack each other's datasets by name, version and hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import RunningServer, serve_tenants
from typer.testing import CliRunner, Result

from aicluster.artifacts.shards import plan_folder
from aicluster.cli.main import app
from aicluster.core import Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

OCTETS = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    tenants = [Tenant(name, quota={"H100": 8}) for name in ("a", "b", "q")]
    grants = {
        "alice": ("a", Role.MEMBER),
        "bob": ("b", Role.MEMBER),
        "vera": ("a", Role.VIEWER),
        "quinn": ("q", Role.MEMBER),
    }
    state = tmp_path_factory.mktemp("state")
    with serve_tenants(module_store_url, state, tenants, grants) as running:
        yield running


def _cli(server: RunningServer, who: str, *args: str) -> Result:
    return CliRunner().invoke(app, [*args, "--url", server.url, "--token", server.tokens[who]])


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


def _spec(name: str, tenant: str, data: list[str]) -> str:
    return json.dumps({"name": name, "tenant": tenant, "module": "t", "data": data})


def test_push_ls_show_and_a_second_version_sends_only_new_shards(
    server: RunningServer, tmp_path: Path
) -> None:
    folder = _folder(tmp_path / "d", {"train.txt": b"x" * 3000, "labels/y.csv": b"1,2\n"})
    pushed = _cli(server, "alice", "data", "push", str(folder), "--name", "corpus")
    assert pushed.exit_code == 0, pushed.output
    assert "pushed corpus:1" in pushed.output and "2 files" in pushed.output
    (folder / "extra.txt").write_bytes(b"new")
    again = _cli(server, "alice", "data", "push", str(folder), "--name", "corpus")
    assert "pushed corpus:2" in again.output, again.output
    listed = _cli(server, "vera", "data", "ls", "--tenant", "a", "-o", "json")
    versions = json.loads(listed.output)["versions"]
    assert [(v["name"], v["version"]) for v in versions] == [("corpus", 2), ("corpus", 1)]
    shown = _cli(server, "alice", "data", "show", "corpus:latest")
    assert "corpus:2" in shown.output and "labels/y.csv" in shown.output and "alice" in shown.output


def test_submit_resolves_latest_once_and_rm_waits_for_the_job(
    server: RunningServer, tmp_path: Path
) -> None:
    folder = _folder(tmp_path / "d", {"f": b"v1"})
    assert _cli(server, "alice", "data", "push", str(folder), "--name", "pinned").exit_code == 0
    with server.client("alice") as alice:
        job = alice.post("/v1/jobs", content=_spec("reader", "a", ["pinned:latest"]))
        assert job.status_code == 201, job.text
        assert job.json()["spec"]["data"] == ["pinned:1"]
        (folder / "f").write_bytes(b"v2")
        assert _cli(server, "alice", "data", "push", str(folder), "--name", "pinned").exit_code == 0
        assert alice.get(f"/v1/jobs/{job.json()['id']}").json()["spec"]["data"] == ["pinned:1"]
        shown = alice.get("/v1/tenants/a/datasets/pinned/versions/1").json()
        assert shown["used_by"] == [job.json()["id"]]
        refused = _cli(server, "alice", "data", "rm", "pinned:1")
        assert refused.exit_code == 1 and job.json()["id"] in refused.output
        assert alice.post(f"/v1/jobs/{job.json()['id']}/cancel").status_code == 200
    assert _cli(server, "alice", "data", "rm", "pinned:1").exit_code == 0
    with server.client("alice") as alice:
        assert alice.get("/v1/tenants/a/datasets/pinned/versions/1").status_code == 404
        missing = alice.post("/v1/jobs", content=_spec("ghost", "a", ["pinned:1"]))
        assert missing.status_code == 400 and "pinned:1" in missing.json()["error"]


def test_a_tenant_never_reads_or_uses_anothers_dataset(
    server: RunningServer, tmp_path: Path
) -> None:
    folder = _folder(tmp_path / "d", {"secret.txt": b"a's secret"})
    assert _cli(server, "alice", "data", "push", str(folder), "--name", "private").exit_code == 0
    shard = plan_folder(folder).shards[0]["sha256"]
    with server.client("bob") as bob:
        assert bob.get("/v1/tenants/a/datasets").status_code == 404
        assert bob.get("/v1/tenants/a/datasets/private/versions/1").status_code == 404
        assert bob.get("/v1/tenants/b/datasets/private/versions/latest").status_code == 404
        assert bob.head(f"/v1/tenants/a/datasets/shards/{shard}").status_code == 404
        assert bob.head(f"/v1/tenants/b/datasets/shards/{shard}").status_code == 404
        assert bob.delete("/v1/tenants/a/datasets/private/versions/1").status_code == 404
        used = bob.post("/v1/jobs", content=_spec("steal", "b", ["private:1"]))
        assert used.status_code == 400 and "private:1" in used.json()["error"]
        # A manifest naming a's shard by hash: b has no such shard.
        manifest = {
            "format": 1,
            "files": [{"path": "stolen", "size": 10, "pieces": [[0, 0, 10]]}],
            "shards": [{"sha256": shard, "size": 10}],
        }
        stolen = bob.post("/v1/tenants/b/datasets/stolen/versions", json=manifest)
        assert stolen.status_code == 400 and "not uploaded for tenant 'b'" in stolen.json()["error"]
    with server.client("vera") as vera:  # a viewer reads but does not push
        assert vera.get("/v1/tenants/a/datasets/private/versions/1").status_code == 200
        assert (
            vera.post(f"/v1/tenants/a/datasets/shards/{'0' * 64}", content=b"x").status_code == 403
        )


def test_bad_uploads_and_manifests_are_4xx(server: RunningServer) -> None:
    with server.client("alice") as alice:
        wrong = alice.post(
            f"/v1/tenants/a/datasets/shards/{'0' * 64}", content=b"x", headers=OCTETS
        )
        assert wrong.status_code == 400 and "SHA-256" in wrong.json()["error"]
        escape = {
            "format": 1,
            "files": [{"path": "../../etc/passwd", "size": 0, "pieces": []}],
            "shards": [],
        }
        bad = alice.post("/v1/tenants/a/datasets/x/versions", json=escape)
        assert bad.status_code == 400 and "relative path" in bad.json()["error"]
        assert alice.post("/v1/tenants/a/datasets/Bad..Name/versions", json={}).status_code == 422
        assert alice.get("/v1/tenants/a/datasets/x/versions/0").status_code == 422


def test_the_data_quota_refuses_a_push_and_names_it(server: RunningServer, tmp_path: Path) -> None:
    set_policy = _cli(server, "admin", "data", "policy", "q", "--quota-bytes", "1000")
    assert set_policy.exit_code == 0 and "1.0 kB" in set_policy.output, set_policy.output
    assert _cli(server, "quinn", "data", "policy", "q", "--quota-bytes", "9").exit_code == 1
    body = b"y" * 1500
    with server.client("quinn") as quinn:
        sha = hashlib.sha256(body).hexdigest()
        over = quinn.post(f"/v1/tenants/q/datasets/shards/{sha}", content=body, headers=OCTETS)
        assert over.status_code == 413 and "1000 bytes" in over.json()["error"]
    folder = _folder(tmp_path / "d", {"big": body})
    refused = _cli(server, "quinn", "data", "push", str(folder), "--name", "big")
    assert refused.exit_code == 1 and "quota of 1000 bytes" in refused.output


def test_retention_runs_at_push(server: RunningServer, tmp_path: Path) -> None:
    assert _cli(server, "admin", "data", "policy", "b", "--keep-versions", "1").exit_code == 0
    folder = _folder(tmp_path / "d", {"f": b"1"})
    _cli(server, "bob", "data", "push", str(folder), "--name", "rolling")
    (folder / "f").write_bytes(b"2")
    second = _cli(server, "bob", "data", "push", str(folder), "--name", "rolling")
    assert "retention removed rolling:1" in second.output, second.output
    with server.client("bob") as bob:
        versions: list[dict[str, Any]] = bob.get("/v1/tenants/b/datasets").json()["versions"]
    assert [v["version"] for v in versions if v["name"] == "rolling"] == [2]


def test_a_folder_with_a_link_out_is_refused_readably(
    server: RunningServer, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_bytes(b"not for the dataset")
    folder = _folder(tmp_path / "d", {"ok.txt": b"1"})
    (folder / "leak").symlink_to(tmp_path / "secret")
    refused = _cli(server, "alice", "data", "push", str(folder), "--name", "leaky")
    assert refused.exit_code == 1 and "a symbolic link out of the folder" in refused.output
    assert "Traceback" not in refused.output
    bad_name = _cli(server, "alice", "data", "push", str(folder), "--name", "../up")
    assert bad_name.exit_code == 1 and "is not a dataset name" in bad_name.output
    bad_ref = _cli(server, "alice", "data", "show", "leaky")
    assert bad_ref.exit_code == 2 and "NAME:VERSION" in bad_ref.output
