"""Serving end to end on a real multi-node Ray cluster: a server process (gateway, deployer),
Ray Serve replicas of a registered torch model, real HTTP.

Deploy and predict (each replica on the node the scheduler placed its service job on); bad
input is 422; one tenant cannot see, call or deploy another's model; deleting a deployment
removes its Serve application. An autoscaling range under load: ``test_service_gangs.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverproc import wait_for
from serving import (
    ServingServer,
    mlp_inputs,
    placed_nodes,
    register_mlp,
    replica_actors,
    replica_nodes,
    serving_server,
)

from aicluster.serve import app_name

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingServer]:
    with serving_server(ray_cluster.address, tmp_path_factory.mktemp("serving")) as running:
        yield running


def test_deploy_predict_and_bad_input(server: ServingServer, tmp_path: Path) -> None:
    version = register_mlp(server.store, "a", "mlp", tmp_path, tag="first")
    out = server.deploy("user-a", "mlp", version, replicas=2)
    assert out["tenant"] == "a" and out["endpoint"].endswith("/v1/models/mlp/predict?tenant=a")
    server.wait_serving("user-a", "mlp", version)
    answer = server.predict("user-a", "mlp")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "mlp" and body["version"] == version
    assert len(body["outputs"]["y"]) == 2 and body["outputs"]["tag"] == "first"
    # Each replica is a service job: it runs on the node the scheduler placed that job on.
    placed = placed_nodes(server.service_jobs("a", "mlp"))
    assert sum(placed.values()) == 2
    assert replica_nodes(app_name("a", "mlp", version)) == placed
    with server.client("user-a") as client:  # the dashboard's deployments view
        shown = client.get("/v1/ui/deployments").json()["versions"]
    row = next(v for v in shown if v["model"] == "mlp" and v["version"] == str(version))
    assert (row["healthy_replicas"], row["desired_replicas"]) == (2, "2"), row
    bad = server.predict("user-a", "mlp", {"x": [1, 2]})
    assert bad.status_code == 422 and "x must be a list" in bad.json()["error"]
    with server.client("user-a") as client:
        not_json = client.post("/v1/models/mlp/predict", content=b"[1, 2")
        assert not_json.status_code == 422
        missing = client.post("/v1/models/nothing/predict", json=mlp_inputs())
        assert missing.status_code == 404


def test_another_tenant_cannot_see_call_or_deploy(server: ServingServer, tmp_path: Path) -> None:
    version = register_mlp(server.store, "a", "secret", tmp_path)
    server.deploy("user-a", "secret", version)
    server.wait_serving("user-a", "secret", version)
    assert server.predict("user-a", "secret").status_code == 200
    with server.client("user-b") as client:
        assert client.post("/v1/models/secret/predict", json=mlp_inputs()).status_code == 404
        assert (
            client.post("/v1/models/secret/predict?tenant=a", json=mlp_inputs()).status_code == 404
        )
        assert client.get("/v1/deployments/secret").status_code == 404
        assert client.get("/v1/deployments/secret?tenant=a").status_code == 404
        assert [d["name"] for d in client.get("/v1/deployments").json()] == []
        assert client.delete("/v1/deployments/secret").status_code == 404
        # b's own namespace: a model called "secret" is not registered for b.
        deploy = client.post("/v1/deployments", json={"model": "secret", "version": version})
        assert deploy.status_code == 404
        as_a = client.post(
            "/v1/deployments", json={"model": "secret", "version": version, "tenant": "a"}
        )
        assert as_a.status_code == 404
    assert server.predict("user-a", "secret").status_code == 200
    with server.client() as admin:
        names = {(d["tenant"], d["name"]) for d in admin.get("/v1/deployments").json()}
        assert ("a", "secret") in names


def test_delete_removes_the_application(server: ServingServer, tmp_path: Path) -> None:
    version = register_mlp(server.store, "b", "gone", tmp_path)
    server.deploy("user-b", "gone", version)
    server.wait_serving("user-b", "gone", version)
    with server.client("user-b") as client:
        assert client.delete("/v1/deployments/gone").status_code == 204
        assert client.post("/v1/models/gone/predict", json=mlp_inputs()).status_code == 404
    app = app_name("b", "gone", version)
    wait_for(lambda: not replica_actors(app), 60, "the replicas to go", [server.process])


def test_cli_serve_deployments_predict_undeploy(server: ServingServer, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from aicluster.cli.main import app

    version = register_mlp(server.store, "b", "clip", tmp_path, tag="cli")
    runner = CliRunner()
    login = ["--url", server.url, "--token", server.tokens["user-b"]]
    served = runner.invoke(app, ["serve", f"clip:{version}", "--replicas", "1", *login])
    assert served.exit_code == 0, served.output
    assert "serving clip:1 on 1 replica(s)" in served.output
    listed = runner.invoke(app, ["deployments", *login], terminal_width=200)
    assert listed.exit_code == 0 and "v1 100%" in listed.output and "v1 1/1" in listed.output
    answer = runner.invoke(app, ["predict", "clip", "--json", json.dumps(mlp_inputs()), *login])
    assert answer.exit_code == 0 and '"tag": "cli"' in answer.output, answer.output
    bad = runner.invoke(app, ["predict", "clip", "--json", '{"x": 1}', *login])
    assert bad.exit_code == 1 and "HTTP 422" in bad.output and "Traceback" not in bad.output
    as_a = ["--url", server.url, "--token", server.tokens["user-a"]]
    other = runner.invoke(app, ["predict", "clip", "--json", "{}", *as_a])
    assert other.exit_code == 1 and "HTTP 404" in other.output
    gone = runner.invoke(app, ["undeploy", "clip", *login])
    assert gone.exit_code == 0, gone.output
    assert "no deployments" in runner.invoke(app, ["deployments", *login]).output
