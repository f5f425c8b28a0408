"""Continuous-learning pipelines through a real API server and store (SQLite and PostgreSQL):
the CLI and REST create, list, show, pause, resume and delete them, refusing bad input with a
reason and hiding them from other tenants; the leader's driver, looked at tick by tick, fires
one run for triggers that hold together, never two at once, submits the job on the newest data
under the tenant's name, canaries what it registers, and leaves serving alone when the job fails.
(The drift scores are the one stand-in: the served end to end is test_pipeline_e2e.py.)"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver import RunningServer, serve_tenants
from modelkit import job_export_dir, write_export
from serving import register_mlp
from typer.testing import CliRunner

from aicluster.cli.main import app as cli_app
from aicluster.control.learning.pipelines import PipelineDriver
from aicluster.control.learning.registry import register_on_success
from aicluster.core import JobState, Node, Tenant
from aicluster.serve.rollout import promote
from aicluster.store import Role, Store

pytestmark = pytest.mark.integration

PIPELINE = {
    "name": "fresh",
    "deployment": "clf",
    "job": {
        "name": "clf",
        "module": "train",
        "resources": {"gpus": 1, "gpu_type": "H100"},
        "data": ["rows:latest"],
    },
    "triggers": {"new_data": ["rows"], "drift": {"threshold": 0.3, "sustained_s": 5}},
    "canary": {"steps": [50, 100], "interval_s": 5},
    "cooldown_s": 0,
}


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve_tenants(
        module_store_url,
        tmp_path_factory.mktemp("state"),
        [Tenant(name, quota={"H100": 8}) for name in ("a", "b")],
        {"alice": ("a", Role.MEMBER), "vera": ("a", Role.VIEWER), "bob": ("b", Role.MEMBER)},
        [Node("node-0", 8, "H100", "rack-0", "pod-0")],
    ) as running:
        store = running.plane.store
        push(store, "a", 1)
        register_mlp(store, "a", "clf", tmp_path_factory.mktemp("models"))
        store.put_deployment("a", "clf", {"replicas": 1}, {1: 100.0}, "alice")
        yield running


def push(store: Store, tenant: str, n: int) -> int:
    data = f"rows {n}".encode()
    sha = hashlib.sha256(data).hexdigest()
    manifest = {
        "format": 1,
        "files": [{"path": "rows.txt", "size": len(data), "pieces": [[0, 0, len(data)]]}],
        "shards": [{"sha256": sha, "size": len(data)}],
    }
    record, _ = store.create_dataset_version(
        tenant,
        "rows",
        manifest,
        hashlib.sha256(sha.encode()).hexdigest(),
        "alice",
        default_quota=1 << 30,
    )
    return record.version


def cli(server: RunningServer, who: str, *args: str) -> Any:
    target = ["--url", server.url, "--token", server.tokens[who]]
    return CliRunner().invoke(cli_app, [*args, *target], env={"COLUMNS": "200"})


def test_the_cli_creates_lists_shows_pauses_resumes_and_deletes(
    server: RunningServer, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print('train')\n")
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({**PIPELINE, "name": "walked"}))
    created = cli(server, "alice", "pipeline", "create", "-f", str(path))
    assert created.exit_code == 0, created.output
    assert "new version of rows" in created.output
    listed = cli(server, "alice", "pipeline", "list")
    assert "walked" in listed.output and "active" in listed.output
    assert cli(server, "alice", "pipeline", "pause", "walked").exit_code == 0
    assert "paused" in cli(server, "alice", "pipeline", "show", "walked").output
    assert cli(server, "alice", "pipeline", "resume", "walked").exit_code == 0
    with server.client("alice") as alice:
        shown = alice.get("/v1/tenants/a/pipelines/walked").json()
    assert shown["paused"] is False and len(shown["spec"]["job"]["code"]) == 64  # shipped
    assert cli(server, "alice", "pipeline", "delete", "walked").exit_code == 0
    gone = cli(server, "alice", "pipeline", "show", "walked")
    assert gone.exit_code == 1 and "no pipeline" in gone.output


@pytest.mark.parametrize(
    ("change", "status", "words"),
    [
        ({"deployment": "nope", "job": {**PIPELINE["job"], "name": "nope"}}, 400, "serves no"),
        ({"triggers": {}}, 422, "at least one trigger"),
        ({"job": {**PIPELINE["job"], "data": ["logs:latest"]}}, 400, "no dataset logs"),
        ({"job": {**PIPELINE["job"], "workers": "two"}}, 422, "workers"),
        ({"tenant": "b"}, 422, "names 'b'"),
    ],
)
def test_bad_input_is_refused_with_its_reason(
    server: RunningServer, change: dict[str, Any], status: int, words: str
) -> None:
    with server.client("alice") as alice:
        answer = alice.post("/v1/tenants/a/pipelines", json={**PIPELINE, **change})
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]


def test_other_tenants_and_viewers_cannot_touch_a_pipeline(server: RunningServer) -> None:
    with server.client("alice") as alice:
        assert alice.post("/v1/tenants/a/pipelines", json=PIPELINE).status_code == 201
        assert alice.post("/v1/tenants/a/pipelines", json=PIPELINE).status_code == 409
    with server.client("vera") as vera:
        assert vera.get("/v1/tenants/a/pipelines/fresh").status_code == 200
        assert vera.post("/v1/tenants/a/pipelines/fresh/pause").status_code == 403
    with server.client("bob") as bob:
        for path in ("/v1/tenants/a/pipelines/fresh", "/v1/tenants/a/pipelines"):
            assert bob.get(path).status_code in (403, 404)
        assert bob.delete("/v1/tenants/a/pipelines/fresh").status_code in (403, 404)
        assert bob.get("/v1/pipelines").json() == []


def test_a_tenant_holds_a_bounded_number_of_pipelines(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipelines submit through the leader, not the API's cap on pending jobs; the cap on
    pipelines a tenant holds bounds what they can queue (lowered here to the tenant's count +1)."""
    held = len(server.plane.store.list_pipelines("a"))
    monkeypatch.setattr("aicluster.store.pipelines.MAX_PIPELINES_PER_TENANT", held + 1)
    with server.client("alice") as alice:
        assert (
            alice.post("/v1/tenants/a/pipelines", json={**PIPELINE, "name": "cap-1"}).status_code
            == 201
        )
        refused = alice.post("/v1/tenants/a/pipelines", json={**PIPELINE, "name": "cap-2"})
        assert refused.status_code == 409, refused.text
        assert "the most one tenant may have" in refused.json()["error"]
        assert alice.get("/v1/tenants/a/pipelines/cap-2").status_code == 404
        # the cap counts the tenant's own: b, with none, may still create one (here the store's
        # call, as b serves no model for the API to accept a pipeline of)
        store = server.plane.store
        store.create_pipeline("b", "cap-b", {}, {}, "test")
        store.delete_pipeline("b", "cap-b", "test")
        assert alice.delete("/v1/tenants/a/pipelines/cap-1").status_code == 204


class Looks:
    """The driver, with drift scores the test sets, looked at tick by tick."""

    def __init__(self, store: Store) -> None:
        self.store, self.scores = store, {}  # type: ignore[var-annotated]
        self.driver = PipelineDriver(store, lambda: self.scores)
        self.now = time.time()

    def tick(self, seconds: float = 1.0) -> list[dict[str, Any]]:
        self.now += seconds
        self.driver.tick(self.now)
        record = self.store.get_pipeline("a", "fresh")
        return [vars(run) for run in self.store.pipeline_runs(record.id)]


def finish(server: RunningServer, job_id: str, state: JobState) -> None:
    store = server.plane.store
    for step in (JobState.STARTING, JobState.RUNNING, state):
        store.transition(job_id, step, "test")
    if state is JobState.SUCCEEDED:
        write_export(job_export_dir(server.plane.settings.state_dir, job_id))
        register_on_success(store, server.plane.settings.state_dir, store.get_job("a", job_id), "t")


def test_the_driver_retrains_on_new_data_and_canaries_the_result(server: RunningServer) -> None:
    store, looks = server.plane.store, Looks(server.plane.store)
    assert looks.tick() == []  # created after rows:1: nothing new yet
    looks.scores = {("a", "clf", 1): 0.9}  # the served version drifts from now on
    assert looks.tick(0) == []  # not for 5 s yet
    newest = push(store, "a", 2)
    (run,) = looks.tick(6)  # drift sustained and a new version: one run for both
    assert run["state"] == "training" and len(run["reasons"]) == 2
    assert run["reasons"][1] == f"new version rows:{newest}" and "drift" in run["reasons"][0]
    push(store, "a", 3)  # while the run trains: no second run
    (run,) = looks.tick()
    job = store.get_job("a", run["job_id"])
    assert job.spec.data == [f"rows:{newest}"] and job.spec.model.parent == "clf:1"
    assert job.submitted_by == "pipeline/fresh" and job.state is JobState.PENDING
    finish(server, job.id, JobState.SUCCEEDED)
    (run,) = looks.tick()
    assert (run["state"], run["model_version"]) == ("rolling_out", 2)
    rollout = store.get_rollout("a", run["rollout_id"])
    assert (rollout.from_version, rollout.to_version, rollout.steps) == (1, 2, (50, 100))
    promote(store, "a", "clf", "test")
    (run,) = looks.tick()
    assert run["state"] == "promoted"
    lineage = store.model_lineage("a", "clf", 2)
    assert [d.ref for d in lineage.datasets] == [f"rows:{newest}"] and lineage.traffic == 100.0
    kinds = [
        e.kind
        for e in store.audit("a", limit=100_000)
        if e.kind.startswith("pipeline.") and e.details.get("pipeline") == "fresh"
    ]
    steps = ["fired", "job_submitted", "canary_started", "promoted"]
    assert kinds[-4:] == [f"pipeline.{step}" for step in steps]


def test_a_failed_retraining_leaves_serving_untouched_and_pause_holds_triggers(
    server: RunningServer,
) -> None:
    store, looks = server.plane.store, Looks(server.plane.store)
    before = store.get_deployment("a", "clf").traffic
    second, _ = looks.tick()[:2]  # rows:3 was pushed during the first run: it fires now
    assert second["state"] == "training" and "rows:3" in second["reasons"][0]
    finish(server, second["job_id"], JobState.FAILED)
    ended = looks.tick()[0]
    assert ended["state"] == "failed" and second["job_id"] in ended["detail"]
    assert store.get_deployment("a", "clf").traffic == before
    assert store.current_rollout("a", "clf") is None
    with server.client("alice") as alice:
        assert alice.post("/v1/tenants/a/pipelines/fresh/pause").status_code == 200
    push(store, "a", 4)
    assert looks.tick()[0]["id"] == ended["id"]  # paused: nothing fires
    with server.client("alice") as alice:
        assert alice.post("/v1/tenants/a/pipelines/fresh/resume").status_code == 200
    assert looks.tick()[0]["state"] == "training"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("name: p\ndeployment: clf\n", "expected a mapping"),
        ("a: &x 1\nb: *x\n", "aliases"),
    ],
)
def test_the_cli_names_a_bad_file_without_a_traceback(
    server: RunningServer, tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    result = cli(server, "alice", "pipeline", "create", "-f", str(path))
    assert result.exit_code == 2 and words in result.output, result.output
    assert "Traceback" not in result.output
