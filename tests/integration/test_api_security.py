"""Every route of the OpenAPI schema, called with no token, another tenant's token and a viewer's
token, on a real server and store: nothing leaks, nothing changes that should not."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from apiserver import RunningServer, serve_tenants
from modelkit import write_export

from aicluster.artifacts import code_store, pack_tree
from aicluster.core import Node, Tenant
from aicluster.core.pipelines import PipelineSpec
from aicluster.store import Role

pytestmark = pytest.mark.integration

JOB_SPEC = "name: secret-a-job\ntenant: a\nmodule: train\nworkers: 2\n"
PIPELINE = PipelineSpec.model_validate(
    {
        "name": "a",
        "deployment": "a",
        "job": {"name": "a", "module": "train", "resources": {"gpus": 0}},
        "triggers": {"schedule_s": 86400},
    }
).model_dump(mode="json")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    state_dir = tmp_path_factory.mktemp("state")
    with serve_tenants(
        str(state_dir),
        state_dir,
        [Tenant(name, quota={"H100": 8}) for name in ("a", "b")],
        {"alice": ("a", Role.MEMBER), "bob": ("b", Role.ADMIN), "vera": ("a", Role.VIEWER)},
        [Node("node-0", 8, "H100", "rack-0", "pod-0")],
    ) as running:
        store = running.plane.store
        report = state_dir / "reports" / "sim-demo"  # for the dashboard's report routes
        report.mkdir(parents=True)
        (report / "summary.json").write_text('{"runs": []}')
        code = state_dir / "code-a"  # shipped code of tenant a, for the code routes
        code.mkdir()
        (code / "train.py").write_text("print('a')\n")
        with pack_tree(code) as packed:
            archive = packed.path.read_bytes()
            code_store(state_dir).put("a", [archive], max_bytes=1 << 20, tenant_quota_bytes=1 << 20)
        with running.client("alice") as alice:
            push_dataset(alice, archive)  # dataset "a", version 1: its shard is the code's hash
            created = alice.post(
                "/v1/jobs", content=JOB_SPEC, headers={"Content-Type": "application/yaml"}
            )
            assert created.status_code == 201, created.text
        # a model named like the tenant, so that "/v1/models/{name}" routes find one
        store.register_model_version(
            "a",
            "a",
            source_dir=write_export(state_dir / "export-a"),
            job_id=created.json()["id"],
            spec_hash=None,
            code_version="0" * 64,
            dataset_hash=None,
            metrics={},
            registered_by="alice",
        )
        # ...served, with a rollout (id 1), for the deployment and rollout routes
        store.put_deployment("a", "a", {"replicas": 1}, {1: 100.0}, "alice")
        store.create_rollout(
            "a", "a", from_version=1, to_version=1, steps=[100], interval_s=60,
            max_error_rate=0.01, max_p99_ms=500, actor="alice",
        )  # fmt: skip
        # ...and kept fresh by a pipeline of that name too, for the pipeline routes
        store.create_pipeline("a", "a", PIPELINE, {"last_fired": 0}, "alice")
        yield running


def push_dataset(alice: httpx.Client, data: bytes) -> None:
    sha, size = hashlib.sha256(data).hexdigest(), len(data)
    assert alice.post(f"/v1/tenants/a/datasets/shards/{sha}", content=data).status_code == 201
    file = {"path": "code.tar.gz", "size": size, "pieces": [[0, 0, size]]}
    manifest = {"format": 1, "files": [file], "shards": [{"sha256": sha, "size": size}]}
    assert alice.post("/v1/tenants/a/datasets/a/versions", json=manifest).status_code == 201


def routes(server: RunningServer) -> list[tuple[str, str]]:
    with server.client() as anonymous:
        schema = anonymous.get("/openapi.json").json()
    return [(method.upper(), path) for path, item in schema["paths"].items() for method in item]


def secrets(server: RunningServer) -> dict[str, Any]:
    store = server.plane.store
    (job,), _ = store.list_jobs("a")
    alice_token = next(t for t in store.list_tokens("alice"))
    (code,) = (server.plane.settings.state_dir / "artifacts" / "code" / "a").glob("*.tar.gz")
    return {"job": job.id, "token_id": alice_token.id, "code": code.name.split(".")[0]}


def fill(path: str, found: dict[str, Any]) -> str:
    values = {"job_id": found["job"], "tenant": "a", "token_id": found["token_id"], "version": 1}
    values["rollout_id"] = 1
    values["sha256"] = found["code"]
    values |= {"report": "sim-demo", "file": "summary.json"}
    values["name"] = "node-0" if path.startswith("/v1/nodes") else "a"
    return re.sub(r"{(\w+)}", lambda match: str(values[match.group(1)]), path)


def body_for(method: str, path: str, found: dict[str, Any]) -> dict[str, Any]:
    if path == "/v1/models/{name}/versions":
        return {"json": {"job_id": found["job"]}}
    if path == "/v1/jobs" and method == "POST":
        return {"content": JOB_SPEC, "headers": {"Content-Type": "application/yaml"}}
    bodies = {
        "/v1/tenants/{name}": {"name": "a", "quota": {"H100": 999}},
        "/v1/tenants/{tenant}/members": {"user": "bob", "role": "admin"},
        "/v1/tokens": {"user": "alice"},
        "/v1/users": {"name": "mallory", "cluster_admin": True},
        "/v1/models/{name}/rollouts": {"version": 1},
        "/v1/tenants/{tenant}/datasets/{name}/versions": {"format": 1, "files": [], "shards": []},
        "/v1/tenants/{tenant}/data-policy": {"quota_bytes": 999},
        "/v1/tenants/{tenant}/pipelines": {**PIPELINE, "name": "b-made"},
    }
    return {"json": bodies[path]} if path in bodies else {}


def call(server: RunningServer, who: str | None, method: str, path: str) -> tuple[int, str]:
    found = secrets(server)
    with server.client(who) as client:
        response = client.request(method, fill(path, found), **body_for(method, path, found))
    return response.status_code, response.text


PUBLIC = {("GET", "/healthz"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc")}
# The dashboard's sign-in (it takes a token in its body: 422 without one) and sign-out (it only
# forgets the caller's own cookie).
PUBLIC |= {("POST", "/v1/ui/session"), ("DELETE", "/v1/ui/session")}


def test_every_route_requires_a_token(server: RunningServer) -> None:
    open_routes = []
    for method, path in routes(server):
        status, _ = call(server, None, method, path)
        if (method, path) not in PUBLIC and status != 401:
            open_routes.append((method, path, status))
    assert open_routes == []


def test_another_tenant_sees_and_changes_nothing(server: RunningServer) -> None:
    found = secrets(server)
    leaks = []
    for method, path in routes(server):
        status, text = call(server, "bob", method, path)
        sent = fill(path, found) + str(body_for(method, path, found))
        for secret in (found["job"], "secret-a-job", found["token_id"]):
            if secret in text and secret not in sent:  # an echo of the request is no leak
                leaks.append((method, path, status, secret))
        if '"name":"a"' in text.replace(" ", ""):
            leaks.append((method, path, status, "tenant a"))
        touches_a = "{job_id}" in path or "/tenants/{" in path or path.startswith("/v1/models/")
        if touches_a and status not in (403, 404, 401):
            leaks.append((method, path, status, "reached another tenant's object"))
    assert leaks == []
    store = server.plane.store
    job = store.get_job("a", found["job"])
    assert job.cancel_requested_at is None and job.state.value == "PENDING"
    assert store.get_tenant("a").quota == {"H100": 8}
    assert "a" not in store.get_user("bob").roles


#: Reads of every tenant's data at once: cluster admins only (403 to anyone else).
ADMIN_READS = {("GET", "/v1/twin/export")}


def test_a_viewer_reads_but_cannot_change(server: RunningServer) -> None:
    changed = []
    for method, path in routes(server):
        status, _ = call(server, "vera", method, path)
        if (method, path) in ADMIN_READS:
            if status != 403:
                changed.append((method, path, status, "a viewer read every tenant's data"))
            continue
        mutating = method in ("POST", "PUT", "DELETE")
        allowed_for_viewer = path in ("/v1/tokens",) and method != "POST"
        allowed_for_viewer |= (method, path) == ("DELETE", "/v1/ui/session")  # signing out
        if mutating and status < 400 and not allowed_for_viewer:
            changed.append((method, path, status))
        if not mutating and status >= 400:
            changed.append((method, path, status, "viewer could not read"))
    assert changed == []


def test_unknown_job_and_malformed_requests_are_4xx(server: RunningServer) -> None:
    with server.client("alice") as alice:
        assert alice.get("/v1/jobs/j-nope").status_code == 404
        bad = alice.post(
            "/v1/jobs",
            content="name: x\nworkers: -1\n",
            headers={"Content-Type": "application/yaml"},
        )
        assert bad.status_code == 422 and "workers" in bad.json()["error"]
        # entrypoint is optional (module: may replace it), so its absence is checked only once
        # the fields are valid
        bare = alice.post("/v1/jobs", content="name: x\n")
        assert bare.status_code == 422 and "entrypoint" in bare.json()["error"]
        huge = alice.post("/v1/jobs", content=b"x" * (2 << 20))
        assert huge.status_code == 413
        assert alice.post("/v1/jobs", content=b"\xff\xfe").status_code == 422
        unknown = alice.post("/v1/jobs", content="name: x\ntenant: nope\nmodule: t\n")
        assert unknown.status_code == 404


def test_auth_cannot_be_disabled_off_loopback(tmp_path: Path) -> None:
    from aicluster.api import InsecureBinding, ServerSettings

    with pytest.raises(InsecureBinding):
        ServerSettings(state_dir=tmp_path, host="0.0.0.0", auth=False)
    assert ServerSettings(state_dir=tmp_path, host="127.0.0.1", auth=False).url
