"""The continuous-learning loop end to end: a real server process (gateway, deployer, rollout
controller, drift monitor, pipeline driver, control loop) on the embedded Ray cluster, a served
torch model under steady HTTP load, datasets pushed with the CLI.

The test pushes a new dataset version, then shifts the requests' inputs until the served
version drifts; the drift-triggered pipeline retrains on the newest version, registers and
canaries the result, which is promoted, while every request is answered; lineage names dataset
version → job → model version → deployment. A second drift retrains on data that makes a bad
model: its canary is rolled back and the good version still serves."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverproc import wait_for
from serving import LoadGenerator, ServingServer, environment, register_mlp, serving_server
from shipping import ship

from aicluster.train.export import numeric_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

JOB = Path(__file__).parent / "retrain_job"
# Short windows so that drift shows within seconds (read by the server process at start).
DRIFT_ENV = {
    "AICLUSTER_DRIFT_SAMPLE_EVERY": "1",
    "AICLUSTER_DRIFT_MIN_SAMPLES": "80",
    "AICLUSTER_DRIFT_WINDOW_S": "20",
    "AICLUSTER_DRIFT_THRESHOLD": "0.3",
}
SPREAD = [-2.0, -1.5, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0]  # balanced around a reference's median


def inputs(centre: float) -> bytes:
    return json.dumps({"x": [centre + d for d in SPREAD]}).encode()


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingServer]:
    work = tmp_path_factory.mktemp("pipeline-e2e")
    with environment(DRIFT_ENV), serving_server(ray_cluster.address, work) as running:
        yield running


def push(server: ServingServer, folder: Path, centre: float, **config: Any) -> None:
    rng = random.Random(centre)
    folder.mkdir(parents=True)
    rows = {"x": [rng.gauss(centre, 1) for _ in range(2000)], "config": config}
    (folder / "rows.json").write_text(json.dumps(rows))
    server.process.cli(server.tokens["user-a"], "data", "push", str(folder), "--name", "rows")


def runs(server: ServingServer) -> list[dict[str, Any]]:
    with server.client("user-a") as client:
        found: list[dict[str, Any]] = client.get("/v1/tenants/a/pipelines/keep-fresh").json()[
            "runs"
        ]
    return found


def ended(server: ServingServer, count: int) -> dict[str, Any]:
    """The ``count``-th run once it has ended."""

    def done() -> bool:
        found = runs(server)
        return len(found) >= count and found[-count]["state"] not in (
            "starting", "training", "rolling_out",
        )  # fmt: skip

    wait_for(done, 300, f"run {count} to end", [server.process], need_alive=True)
    return runs(server)[-count]


def test_drift_retrains_canaries_and_promotes_and_a_bad_retraining_is_rolled_back(
    server: ServingServer, tmp_path: Path
) -> None:
    training = [random.Random(0).gauss(0, 1) for _ in range(2000)]
    reference = numeric_reference(training, bins=2, feature="x")
    v1 = register_mlp(server.store, "a", "clf", tmp_path / "v1", drift=reference)
    server.deploy("user-a", "clf", v1)
    server.wait_serving("user-a", "clf", v1)
    push(server, tmp_path / "rows-1", 0.0)
    code = ship(server.process.state_dir, "a", JOB)
    pipeline = {
        "name": "keep-fresh",
        "deployment": "clf",
        "job": {
            "name": "clf",
            "code": code,
            "entrypoint": "train.py",
            "resources": {"gpus": 0, "cpus": 1, "memory_gb": 1},
            "data": ["rows:latest"],
        },
        "triggers": {"drift": {"threshold": 0.3, "sustained_s": 3}},
        # 25% first: the gateway retries a failed canary request on the version with the most
        # traffic, which a 50/50 split does not name. Latency is not judged on this busy machine.
        "canary": {"steps": [25, 100], "interval_s": 4, "max_p99_ms": 60_000},
        "cooldown_s": 0,
    }
    with server.client("user-a") as client:
        created = client.post("/v1/tenants/a/pipelines", json=pipeline)
    assert created.status_code == 201, created.text
    path = "/v1/models/clf/predict"
    # A client that retries once after a 503's Retry-After, as a well-behaved one does: a replica
    # starting on this shared 2-core machine can leave the stable one without CPU for a moment.
    token = server.tokens["user-a"]
    with LoadGenerator(server.url, token, path, {}, rate=6, retry=True) as load:
        load.body = inputs(0.0)  # in distribution: no drift
        time.sleep(3)
        assert runs(server) == []
        push(server, tmp_path / "rows-2", 3.0)  # the world moved: new data...
        load.body = inputs(3.0)  # ...and requests from it
        first = ended(server, 1)
        assert first["state"] == "promoted", first
        assert "drift" in first["reasons"][0]
        server.wait_serving("user-a", "clf", first["model_version"])
        # The second time, the newest data makes a bad model (every prediction fails).
        push(server, tmp_path / "rows-3", -3.0, fail_rate=1.0)
        load.body = inputs(-3.0)
        second = ended(server, 2)
        with server.client("user-a") as client:
            client.post("/v1/tenants/a/pipelines/keep-fresh/pause")
    print("load:", load.result.summary())
    assert second["state"] == "rolled_back", second
    assert load.result.errors == 0 and load.result.ok == load.result.sent
    with server.client("user-a") as client:
        deployment = client.get("/v1/deployments/clf").json()
        good = client.get(f"/v1/models/clf/versions/{first['model_version']}").json()
        data = client.get("/v1/tenants/a/datasets/rows/versions/2").json()
    assert [(v["version"], v["weight"]) for v in deployment["versions"]] == [
        (first["model_version"], 100.0)
    ]
    # dataset version -> job -> model version -> deployment
    assert [d["ref"] for d in good["datasets"]] == ["rows:2"]
    assert good["job_id"] == first["job_id"] and good["parent"] == f"clf:{v1}"
    assert good["traffic"] == 100.0 and data["models"] == [good["ref"]]
