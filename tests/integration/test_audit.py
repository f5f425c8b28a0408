"""The audit log through a real API server and store (SQLite and PostgreSQL): who sees which
events, filters and paging, nothing secret in it, and one record for every call of every
state-changing route of the OpenAPI schema."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from apiserver import RunningServer, serve_tenants
from modelkit import job_export_dir, succeeded_job, write_export
from serving import register_mlp
from typer.testing import CliRunner

from aicluster.cli.main import app as cli_app
from aicluster.core import Node, Tenant
from aicluster.serve.rollout import start_rollout
from aicluster.store import Role

pytestmark = pytest.mark.integration

SECRET = "s3cret-" + secrets.token_hex(12)
SPEC = {
    "name": "audited",
    "tenant": "a",
    "module": "train",
    "resources": {"gpus": 1, "gpu_type": "H100"},
    "secrets": {"API_KEY": SECRET},
}


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    state_dir = tmp_path_factory.mktemp("state")
    with serve_tenants(
        module_store_url,
        state_dir,
        [Tenant(name, quota={"H100": 8}) for name in ("a", "b")],
        {"alice": ("a", Role.MEMBER), "bob": ("b", Role.MEMBER), "vera": ("a", Role.VIEWER)},
        [Node("node-0", 8, "H100", "rack-0", "pod-0")],
    ) as running:
        for who, tenant in (("alice", "a"), ("bob", "b")):
            with running.client(who) as client:
                spec = {**SPEC, "tenant": tenant, "name": f"job-of-{tenant}"}
                assert client.post("/v1/jobs", json=spec).status_code == 201
        yield running


def get_audit(server: RunningServer, who: str, **params: Any) -> dict[str, Any]:
    with server.client(who) as client:
        answer = client.get("/v1/audit", params=params)
    assert answer.status_code == 200, answer.text
    page: dict[str, Any] = answer.json()
    return page


def everything(server: RunningServer, who: str, **params: Any) -> list[dict[str, Any]]:
    """Every page of the caller's view, walked with the cursor."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = get_audit(server, who, limit=7, **params, **({"cursor": cursor} if cursor else {}))
        found.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return found


def test_members_see_their_tenants_events_and_admins_all(server: RunningServer) -> None:
    store = server.plane.store
    (job_a,), _ = store.list_jobs("a")
    (job_b,), _ = store.list_jobs("b")
    seen = {who: everything(server, who) for who in ("alice", "bob", "vera", "admin")}
    assert {e["tenant"] for e in seen["alice"]} == {"a"}
    assert {e["tenant"] for e in seen["vera"]} == {"a"}  # any role in the tenant reads it
    assert {e["tenant"] for e in seen["bob"]} == {"b"}
    assert job_a.id in json.dumps(seen["alice"]) and job_a.id not in json.dumps(seen["bob"])
    assert job_b.id in json.dumps(seen["bob"]) and job_b.id not in json.dumps(seen["alice"])
    admin_tenants = {e["tenant"] for e in seen["admin"]}
    assert {"a", "b", None} <= admin_tenants  # tenant-less events (users, tokens, nodes) too
    assert {e["id"] for e in seen["alice"]} < {e["id"] for e in seen["admin"]}
    submits = [e for e in seen["alice"] if e["kind"] == "api.submit_job"]
    assert [(e["actor"], e["details"]["object"]) for e in submits] == [("alice", job_a.id)]
    # an admin keeps one tenant; a member cannot name another tenant's
    only_b = everything(server, "admin", tenant="b")
    assert only_b and {e["tenant"] for e in only_b} == {"b"}
    with server.client("alice") as alice:
        assert alice.get("/v1/audit", params={"tenant": "b"}).status_code == 404
        assert alice.get("/v1/audit", params={"object": job_b.id}).json()["items"] == []
        assert alice.get("/v1/audit", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_nothing_secret_is_in_the_log(server: RunningServer) -> None:
    text = json.dumps(everything(server, "admin"))
    assert SECRET not in text
    assert not [token for token in server.tokens.values() if token in text]


def test_filters_and_paging(server: RunningServer) -> None:
    store = server.plane.store
    (job,), _ = store.list_jobs("a")
    newest = get_audit(server, "admin", limit=500)["items"]
    assert [e["id"] for e in newest] == sorted((e["id"] for e in newest), reverse=True)
    oldest = everything(server, "admin", order="oldest")
    assert [e["id"] for e in oldest] == sorted(e["id"] for e in newest)  # paged = one page
    by_alice = everything(server, "admin", actor="alice")
    assert by_alice and {e["actor"] for e in by_alice} == {"alice"}
    jobs = everything(server, "admin", action="job.")
    assert {e["kind"] for e in jobs} == {"job.submitted"}
    exact = everything(server, "admin", action="api.submit_job")
    assert len(exact) == 2 and {e["kind"] for e in exact} == {"api.submit_job"}
    assert everything(server, "admin", action="api.submit") == []  # exact unless it ends in "."
    about = everything(server, "alice", object=job.id)
    assert {e["kind"] for e in about} == {"job.submitted", "api.submit_job"}
    tenant_events = everything(server, "admin", object="b")
    assert {e["kind"] for e in tenant_events} >= {"tenant.created"}
    middle = oldest[len(oldest) // 2]["at"]
    later = everything(server, "admin", since=middle)
    earlier = everything(server, "admin", until=middle)
    assert {e["id"] for e in later} | {e["id"] for e in earlier} == {e["id"] for e in oldest}
    assert min(e["at"] for e in later) >= middle > max(e["at"] for e in earlier)


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 501},
        {"since": "nan"},
        {"since": "inf"},
        {"since": "yesterday"},
        {"since": 200, "until": 100},
        {"action": "job%"},
        {"actor": "al ice"},
        {"object": ""},
        {"object": "x\x00y"},
        {"cursor": -1},
        {"cursor": 1 << 70},
        {"order": "sideways"},
        {"tenant": "../etc"},
    ],
)
def test_bad_filters_are_422_with_a_message(server: RunningServer, params: dict[str, Any]) -> None:
    with server.client("admin") as admin:
        answer = admin.get("/v1/audit", params=params)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]


def test_the_cli_lists_and_filters(server: RunningServer) -> None:
    def cli(*args: str) -> Any:
        target = ["--url", server.url, "--token", server.tokens["alice"]]
        return CliRunner().invoke(cli_app, ["audit", *args, *target], env={"COLUMNS": "80"})

    (job,), _ = server.plane.store.list_jobs("a")
    table = cli("--since", "1h", "--action", "api.")
    assert table.exit_code == 0, table.output
    assert job.id in table.output and "api.submit_job" in table.output
    listed = json.loads(cli("--object", job.id, "-o", "json").stdout)
    assert {e["kind"] for e in listed["items"]} == {"job.submitted", "api.submit_job"}
    bad = cli("--since", "last tuesday")
    assert bad.exit_code == 2 and "--since" in bad.output and "Traceback" not in bad.output
    refused = cli("--tenant", "b")
    assert refused.exit_code == 1 and "no tenant 'b'" in refused.output


# -- one record for every call of every state-changing route ----------------------------------

#: State-changing operations whose calls change nothing on the server, so leave no record.
NOT_AUDITED = {
    ("POST", "/v1/models/{name}/predict"): "a prediction reads a model; it changes nothing",
    ("POST", "/v1/ui/session"): "signing in stores nothing: the cookie holds the caller's token",
    ("DELETE", "/v1/ui/session"): "signing out drops the caller's own cookie, nothing else",
}


@dataclass
class Call:
    """One call of an operation: who makes it, the concrete path, the request's other arguments
    (from what earlier calls left in ``ctx``), and the record it must leave."""

    who: str
    path: Callable[[dict[str, Any]], str]
    tenant: str | None
    object: Callable[[dict[str, Any]], str | None]
    request: Callable[[dict[str, Any]], dict[str, Any]] = lambda ctx: {}
    keep: Callable[[dict[str, Any], Any], None] = lambda ctx, answer: None


def _keep(key: str, field: str) -> Callable[[dict[str, Any], Any], None]:
    return lambda ctx, answer: ctx.__setitem__(key, answer[field])


def _archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"print('audited')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


_SHARD = b"walked data"
_SHARD_SHA = hashlib.sha256(_SHARD).hexdigest()
_MANIFEST = {
    "format": 1,
    "files": [{"path": "walked.txt", "size": len(_SHARD), "pieces": [[0, 0, len(_SHARD)]]}],
    "shards": [{"sha256": _SHARD_SHA, "size": len(_SHARD)}],
}

#: A pipeline keeping the walk's deployment fresh (on a schedule: it reads no dataset).
_PIPELINE = {
    "name": "walked",
    "deployment": "chat",
    "job": {"name": "chat", "module": "train", "resources": {"gpus": 0}},
    "triggers": {"schedule_s": 86400},
}

#: Every state-changing operation, in the order the walk calls them (later ones use what
#: earlier ones made).
CALLS: dict[tuple[str, str], Call] = {
    ("POST", "/v1/jobs"): Call(
        "alice",
        lambda ctx: "/v1/jobs",
        "a",
        lambda ctx: ctx["job"],
        lambda ctx: {"json": {**SPEC, "name": "walked"}},
        _keep("job", "id"),
    ),
    ("POST", "/v1/jobs/{job_id}/cancel"): Call(
        "alice", lambda ctx: f"/v1/jobs/{ctx['job']}/cancel", "a", lambda ctx: ctx["job"]
    ),
    ("POST", "/v1/tenants/{tenant}/code"): Call(
        "alice",
        lambda ctx: "/v1/tenants/a/code",
        "a",
        lambda ctx: ctx["code"],
        lambda ctx: {"content": _archive(), "headers": {"Content-Type": "application/gzip"}},
        _keep("code", "sha256"),
    ),
    ("POST", "/v1/models/{name}/versions"): Call(
        "alice",
        lambda ctx: "/v1/models/walked/versions",
        "a",
        lambda ctx: "walked:1",
        lambda ctx: {"json": {"job_id": ctx["succeeded"]}},
    ),
    ("PUT", "/v1/tenants/{name}"): Call(
        "admin",
        lambda ctx: "/v1/tenants/c",
        "c",
        lambda ctx: "c",
        lambda ctx: {"json": {"name": "c", "quota": {"H100": 1}}},
    ),
    ("POST", "/v1/users"): Call(
        "admin",
        lambda ctx: "/v1/users",
        None,
        lambda ctx: "carol",
        lambda ctx: {"json": {"name": "carol"}},
    ),
    ("PUT", "/v1/tenants/{tenant}/members"): Call(
        "admin",
        lambda ctx: "/v1/tenants/c/members",
        "c",
        lambda ctx: "carol",
        lambda ctx: {"json": {"user": "carol", "role": "member"}},
    ),
    ("POST", "/v1/tokens"): Call(
        "admin",
        lambda ctx: "/v1/tokens",
        None,
        lambda ctx: ctx["token"],
        lambda ctx: {"json": {"user": "carol"}},
        _keep("token", "id"),
    ),
    ("DELETE", "/v1/tokens/{token_id}"): Call(
        "admin", lambda ctx: f"/v1/tokens/{ctx['token']}", None, lambda ctx: ctx["token"]
    ),
    ("DELETE", "/v1/tenants/{name}"): Call(
        "admin", lambda ctx: "/v1/tenants/c", "c", lambda ctx: "c"
    ),
    ("POST", "/v1/nodes/{name}/cordon"): Call(
        "admin", lambda ctx: "/v1/nodes/node-0/cordon", None, lambda ctx: "node-0"
    ),
    ("POST", "/v1/nodes/{name}/drain"): Call(
        "admin", lambda ctx: "/v1/nodes/node-0/drain", None, lambda ctx: "node-0"
    ),
    ("POST", "/v1/nodes/{name}/uncordon"): Call(
        "admin", lambda ctx: "/v1/nodes/node-0/uncordon", None, lambda ctx: "node-0"
    ),
    ("POST", "/v1/deployments"): Call(
        "alice",
        lambda ctx: "/v1/deployments",
        "a",
        lambda ctx: "chat",
        lambda ctx: {"json": {"model": "chat", "version": 1, "tenant": "a"}},
    ),
    ("POST", "/v1/models/{name}/rollouts"): Call(
        "alice",
        lambda ctx: "/v1/models/chat/rollouts",
        "a",
        lambda ctx: "chat",
        lambda ctx: {"json": {"version": 2, "steps": [50, 100]}},
    ),
    ("POST", "/v1/models/{name}/rollouts/current/promote"): Call(
        "alice", lambda ctx: "/v1/models/chat/rollouts/current/promote", "a", lambda ctx: "chat"
    ),
    ("POST", "/v1/models/{name}/rollouts/current/abort"): Call(
        "alice", lambda ctx: "/v1/models/chat/rollouts/current/abort", "a", lambda ctx: "chat"
    ),
    ("POST", "/v1/tenants/{tenant}/pipelines"): Call(
        "alice",
        lambda ctx: "/v1/tenants/a/pipelines",
        "a",
        lambda ctx: "walked",
        lambda ctx: {"json": _PIPELINE},
    ),
    ("POST", "/v1/tenants/{tenant}/pipelines/{name}/pause"): Call(
        "alice", lambda ctx: "/v1/tenants/a/pipelines/walked/pause", "a", lambda ctx: "walked"
    ),
    ("POST", "/v1/tenants/{tenant}/pipelines/{name}/resume"): Call(
        "alice", lambda ctx: "/v1/tenants/a/pipelines/walked/resume", "a", lambda ctx: "walked"
    ),
    ("DELETE", "/v1/tenants/{tenant}/pipelines/{name}"): Call(
        "alice", lambda ctx: "/v1/tenants/a/pipelines/walked", "a", lambda ctx: "walked"
    ),
    ("DELETE", "/v1/deployments/{name}"): Call(
        "alice", lambda ctx: "/v1/deployments/chat", "a", lambda ctx: "chat"
    ),
    ("POST", "/v1/tenants/{tenant}/datasets/shards/{sha256}"): Call(
        "alice",
        lambda ctx: f"/v1/tenants/a/datasets/shards/{_SHARD_SHA}",
        "a",
        lambda ctx: _SHARD_SHA,
        lambda ctx: {"content": _SHARD},
    ),
    ("POST", "/v1/tenants/{tenant}/datasets/{name}/versions"): Call(
        "alice",
        lambda ctx: "/v1/tenants/a/datasets/walked/versions",
        "a",
        lambda ctx: "walked:1",
        lambda ctx: {"json": _MANIFEST},
    ),
    ("DELETE", "/v1/tenants/{tenant}/datasets/{name}/versions/{version}"): Call(
        "alice", lambda ctx: "/v1/tenants/a/datasets/walked/versions/1", "a", lambda ctx: "walked:1"
    ),
    ("PUT", "/v1/tenants/{tenant}/data-policy"): Call(
        "admin",
        lambda ctx: "/v1/tenants/a/data-policy",
        "a",
        lambda ctx: "data-policy",
        lambda ctx: {"json": {"quota_bytes": 1 << 20, "keep_versions": 5, "keep_days": None}},
    ),
    ("PUT", "/v1/config"): Call(
        "admin",
        lambda ctx: "/v1/config?source=walk.yaml",
        None,
        lambda ctx: f"config {ctx['config']}",  # the configuration it made live
        lambda ctx: {"content": "policy:\n  name: fair\n"},
        _keep("config", "id"),
    ),
}


def state_changing(server: RunningServer) -> set[tuple[str, str]]:
    with server.client() as anonymous:
        schema = anonymous.get("/openapi.json").json()
    return {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method.upper() in ("POST", "PUT", "PATCH", "DELETE")
    }


def test_every_state_changing_call_leaves_one_record(
    server: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    operations = state_changing(server)
    unknown = operations - set(CALLS) - set(NOT_AUDITED)
    assert unknown == set(), "a new state-changing route: add a call to CALLS (or NOT_AUDITED)"
    assert set(CALLS) | set(NOT_AUDITED) == operations, "CALLS names a route that is gone"
    store = server.plane.store
    state_dir = server.plane.settings.state_dir
    done = succeeded_job(store, "a", "exported")
    write_export(job_export_dir(state_dir, done.id))
    work = tmp_path_factory.mktemp("models")
    for _ in range(2):
        register_mlp(store, "a", "chat", work)
    ctx: dict[str, Any] = {"succeeded": done.id}
    for (method, template), call in CALLS.items():
        if template.endswith("/abort"):  # the promote ended the rollout: start another
            start_rollout(
                store, "a", "chat", version=1, steps=[100], interval_s=60,
                max_error_rate=0.01, max_p99_ms=500, actor="test",
            )  # fmt: skip
        mark = store.newest_event_id()
        with server.client(call.who) as client:
            answer = client.request(method, call.path(ctx), **call.request(ctx))
        assert answer.status_code < 400, (method, template, answer.text)
        if answer.content:
            call.keep(ctx, answer.json())
        records = [e for e in store.audit(after_id=mark) if e.kind.startswith("api.")]
        assert len(records) == 1, (method, template, records)
        (record,) = records
        assert record.actor == call.who, (method, template, record)  # users named as keys
        assert record.tenant == call.tenant, (method, template, record)
        assert record.details["object"] == call.object(ctx), (method, template, record)
        assert record.details["method"] == method and record.details["route"] == template
        assert record.details["status"] == answer.status_code
        assert record.details["outcome"] == "ok"


def test_a_failed_call_leaves_no_record_and_a_retry_says_unchanged(
    server: RunningServer,
) -> None:
    store = server.plane.store
    (job,), _ = store.list_jobs("b")
    mark = store.newest_event_id()
    with server.client("alice") as alice:
        assert alice.post(f"/v1/jobs/{job.id}/cancel").status_code == 404
        assert alice.put("/v1/tenants/a", json={"name": "a", "quota": {}}).status_code == 403
    assert store.audit(after_id=mark) == []
    with server.client("alice") as alice:
        spec = {**SPEC, "name": "retried"}
        first = alice.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "k1"})
        mark = store.newest_event_id()
        again = alice.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "k1"})
    assert again.json()["id"] == first.json()["id"]
    (record,) = store.audit(after_id=mark)
    assert (record.kind, record.details["outcome"]) == ("api.submit_job", "unchanged")
