"""The model registry's API on a real server and store (SQLite and PostgreSQL): register from a
job, list, show lineage, tenant isolation, readable 4xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from apiserver import RunningServer, serve_tenants
from modelkit import DATASET, job_export_dir, succeeded_job, write_export

from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.store import Role
from aicluster.train.export import load_predictor, tree_sha256

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    grants = {"alice": ("a", Role.MEMBER), "vera": ("a", Role.VIEWER), "bob": ("b", Role.MEMBER)}
    state_dir = tmp_path_factory.mktemp("state")
    tenants = [Tenant("a"), Tenant("b")]
    with serve_tenants(module_store_url, state_dir, tenants, grants) as running:
        yield running


def trained_job(server: RunningServer, tenant: str, name: str = "train") -> str:
    """A SUCCEEDED job of ``tenant`` whose export is in place; returns its id."""
    job = succeeded_job(server.plane.store, tenant, name)
    write_export(job_export_dir(server.plane.settings.state_dir, job.id))
    return job.id


def test_register_list_and_show_lineage(server: RunningServer) -> None:
    job_id = trained_job(server, "a")
    job = server.plane.store.get_job("a", job_id)
    with server.client("alice") as alice:
        created = alice.post("/v1/models/gpt/versions", json={"job_id": job_id})
        assert created.status_code == 201, created.text
        version = created.json()
        again = alice.post("/v1/models/gpt/versions", json={"job_id": job_id})
        assert again.status_code == 201 and again.json() == version  # idempotent per job
        listed = alice.get("/v1/models").json()
        shown = alice.get("/v1/models/gpt/versions/1").json()
        versions = alice.get("/v1/models/gpt").json()
    assert (version["ref"], version["tenant"], version["registered_by"]) == ("gpt:1", "a", "alice")
    assert [(m["name"], m["latest_version"]) for m in listed] == [("gpt", 1)]
    assert versions == [shown] and shown == version
    record = server.plane.store.get_model_version("a", "gpt", 1)
    assert shown["job_id"] == job_id and shown["spec_hash"] == job.spec_hash
    assert shown["code_version"] == tree_sha256(record.artifact_dir / "code")
    assert (shown["dataset_hash"], shown["metrics"]) == (DATASET, {"loss": 0.5})
    assert shown["entrypoint"] == "linear.py:load" and shown["config"] == {"features": 3}
    assert "artifact" not in str(shown)  # no server paths
    predictor = load_predictor(record.artifact_dir)
    with torch.no_grad():
        torch.manual_seed(0)
        expected = torch.nn.Linear(3, 1)(torch.tensor([[1.0, 2.0, 3.0]])).item()
    assert predictor.predict({"x": [1.0, 2.0, 3.0]})["y"] == pytest.approx(expected)


def test_another_tenant_gets_404_on_list_show_and_register(server: RunningServer) -> None:
    job_id = trained_job(server, "a")
    with server.client("alice") as alice:
        assert alice.post("/v1/models/secret/versions", json={"job_id": job_id}).is_success
    with server.client("bob") as bob:
        assert "secret" not in bob.get("/v1/models").text
        assert bob.get("/v1/models", params={"tenant": "a"}).status_code == 404
        assert bob.get("/v1/models/secret").status_code == 404
        assert bob.get("/v1/models/secret", params={"tenant": "a"}).status_code == 404
        assert bob.get("/v1/models/secret/versions/1").status_code == 404
        stolen = bob.post("/v1/models/secret/versions", json={"job_id": job_id})
        assert stolen.status_code == 404  # as for a job that does not exist
        assert stolen.json()["error"] == f"no job {job_id!r}"
        stolen = bob.post("/v1/models/mine/versions", json={"job_id": job_id})
        assert stolen.status_code == 404
    with server.client("vera") as vera:  # a viewer of tenant a reads but cannot register
        assert vera.get("/v1/models/secret/versions/1").status_code == 200
        denied = vera.post("/v1/models/secret/versions", json={"job_id": job_id})
        assert denied.status_code == 403 and "member" in denied.json()["error"]
    assert [v.version for v in server.plane.store.list_model_versions("a", "secret")] == [1]
    with pytest.raises(Exception, match="no model"):
        server.plane.store.get_model_version("a", "mine")


def test_one_name_in_two_tenants(server: RunningServer) -> None:
    with server.client("alice") as alice:
        assert alice.post("/v1/models/shared/versions", json={"job_id": trained_job(server, "a")})
    with server.client("bob") as bob:
        created = bob.post("/v1/models/shared/versions", json={"job_id": trained_job(server, "b")})
        assert created.status_code == 201 and created.json()["tenant"] == "b"
        assert [v["tenant"] for v in bob.get("/v1/models/shared").json()] == ["b"]
    with server.client("admin") as admin:
        both = admin.get("/v1/models/shared")
        assert both.status_code == 422 and "pass ?tenant=" in both.json()["error"]
        only_b = admin.get("/v1/models/shared", params={"tenant": "b"}).json()
        assert [v["ref"] for v in only_b] == ["shared:1"]
        names = {(m["tenant"], m["name"]) for m in admin.get("/v1/models").json()}
        assert {("a", "shared"), ("b", "shared")} <= names
        listed_b = admin.get("/v1/models", params={"tenant": "b"}).json()
        assert {m["tenant"] for m in listed_b} == {"b"}


def test_refusals_are_readable_4xx(server: RunningServer) -> None:
    store = server.plane.store
    spec = jobspec_from_mapping({"name": "run", "entrypoint": "t.py", "resources": {"gpus": 0}})
    pending, _ = store.submit_job("a", spec, "alice")
    no_export = succeeded_job(store, "a").id
    bad = trained_job(server, "a")
    weights = job_export_dir(server.plane.settings.state_dir, bad) / "weights.safetensors"
    torch.save({"w": torch.ones(1)}, weights)  # a pickle where safetensors belongs
    with server.client("alice") as alice:
        response = alice.post("/v1/models/m/versions", json={"job_id": pending.id})
        assert response.status_code == 409 and "PENDING, not SUCCEEDED" in response.json()["error"]
        response = alice.post("/v1/models/m/versions", json={"job_id": no_export})
        assert response.status_code == 409 and "exported no model" in response.json()["error"]
        response = alice.post("/v1/models/m/versions", json={"job_id": bad})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert "not a safetensors file" in error
        assert str(server.plane.settings.state_dir) not in error
        assert alice.post("/v1/models/m/versions", json={}).status_code == 422
        assert alice.post("/v1/models/m/versions", json={"job_id": "j/../x"}).status_code == 422
        assert alice.post("/v1/models/m/versions", json={"job_id": "j-nope"}).status_code == 404
        assert alice.get("/v1/models/bad%20name").status_code == 422
        assert alice.get("/v1/models/m/versions/0").status_code == 422
        assert alice.get("/v1/models/nothing/versions/1").status_code == 404
        assert alice.get("/v1/models/nothing").status_code == 404
    assert store.get_job("a", pending.id).state is JobState.PENDING
    with pytest.raises(Exception, match="no model"):
        store.list_model_versions("a", "m")


def test_unauthenticated_is_401(server: RunningServer) -> None:
    with server.client() as anonymous:
        assert anonymous.get("/v1/models").status_code == 401
        assert anonymous.post("/v1/models/m/versions", json={"job_id": "j-1"}).status_code == 401
