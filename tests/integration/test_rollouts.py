"""Canary rollouts and drift end to end: a real server process (gateway, deployer, rollout
controller, drift monitor) on a real multi-node Ray cluster, Ray Serve replicas of a registered
torch model, real HTTP under steady load.

A version failing 10% of its requests is rolled back by itself within 3 intervals while overall
success stays ≥ 99%; a healthy version is promoted through every step; every step is an event;
a rollout survives the server's SIGKILL; inputs from another distribution raise the drift score
over its threshold (one event), in-distribution inputs do not. The routes' validation, tenant
rules and manual promote and abort run without Ray (``test_api_rollouts.py``: they write only the
store), the steps between them over a manual clock (``test_rollout_controller.py``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverproc import wait_for
from serving import (
    LoadGenerator,
    ServingServer,
    environment,
    mlp_inputs,
    register_mlp,
    serving_server,
)

from aicluster.train.export import numeric_reference

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

# A 10% canary gets the 20 requests a verdict needs in under 2 intervals; the rate stays well
# under what this shared 2-core machine answers beside the cluster (open-loop load: above it,
# latency grows without bound and verdicts lag the requests).
INTERVAL_S = 8.0
RATE = 15.0
DRIFT_ENV = {
    "AICLUSTER_DRIFT_SAMPLE_EVERY": "1",
    "AICLUSTER_DRIFT_MIN_SAMPLES": "200",
    "AICLUSTER_DRIFT_WINDOW_S": "120",
    "AICLUSTER_DRIFT_THRESHOLD": "0.3",
}


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingServer]:
    with (
        environment(DRIFT_ENV),  # read by the server process at start
        serving_server(ray_cluster.address, tmp_path_factory.mktemp("rollouts")) as running,
    ):
        yield running


@pytest.fixture(autouse=True)
def _undeploy_after(server: ServingServer) -> Iterator[None]:
    """Each test's models stop serving when it ends (``undeploy_all``)."""
    yield
    server.undeploy_all("user-a")


def serve_v1(server: ServingServer, name: str, work_dir: Path, replicas: int = 1) -> int:
    """Version 1 of ``name``, serving. Two replicas where a test judges a rollout by its traffic
    (as a production service would run); one where the traffic is not judged: each replica, and
    each of its canary's, is a process importing torch on this 2-core machine."""
    version = register_mlp(server.store, "a", name, work_dir, tag="v1")
    server.deploy("user-a", name, version, replicas=replicas)
    server.wait_serving("user-a", name, version)
    return version


def start(server: ServingServer, name: str, version: int, **plan: Any) -> dict[str, Any]:
    body = {"version": version, "steps": [10, 25, 50, 100], "interval_s": INTERVAL_S}
    # Latency limits are covered by the unit tests: on this shared machine a healthy version's
    # p99 reached 2.4 s under other sessions' load (and was rightly rolled back for it).
    body |= {"max_error_rate": 0.01, "max_p99_ms": 60_000, **plan}
    with server.client("user-a") as client:
        response = client.post(f"/v1/models/{name}/rollouts", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def show(server: ServingServer, name: str, rollout_id: int) -> dict[str, Any]:
    with server.client("user-a") as client:
        response = client.get(f"/v1/models/{name}/rollouts/{rollout_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_state(server: ServingServer, name: str, rollout: int, state: str, timeout_s: float) -> Any:
    wait_for(
        lambda: show(server, name, rollout)["state"] == state,
        timeout_s,
        f"rollout {rollout} of {name} to be {state}",
        [server.process],
        need_alive=True,
    )
    return show(server, name, rollout)


def weights(server: ServingServer, name: str) -> dict[int, float]:
    versions = server.deployment("user-a", name)["versions"]
    return {int(v["version"]): float(v["weight"]) for v in versions}


def load(server: ServingServer, name: str, rate: float = RATE) -> LoadGenerator:
    path = f"/v1/models/{name}/predict"
    return LoadGenerator(server.url, server.tokens["user-a"], path, mlp_inputs(), rate)


def test_a_failing_version_is_rolled_back_within_three_intervals(
    server: ServingServer, tmp_path: Path
) -> None:
    good = serve_v1(server, "canary", tmp_path, replicas=2)
    bad = register_mlp(server.store, "a", "canary", tmp_path, fail_rate=0.1, tag="bad")
    with load(server, "canary") as traffic:
        time.sleep(2)
        rollout = start(server, "canary", bad)
        assert (rollout["from_version"], rollout["weight"]) == (good, 0)
        done = wait_state(server, "canary", rollout["id"], "rolled_back", 120)
        assert weights(server, "canary") == {good: 100.0}
        time.sleep(2)  # steady load on the good version after the rollback
    result = traffic.result
    print("load:", result.summary(), "reason:", done["reason"])
    events = {e["kind"]: e for e in done["events"]}
    first_step = next(e for e in done["events"] if e["kind"] == "rollout.step")
    took = events["rollout.rolled_back"]["at"] - first_step["at"]
    print(f"rolled back {took:.1f} s after the canary took traffic")
    assert took <= 3 * INTERVAL_S, f"rolled back {took:.1f} s after the canary took traffic"
    figures = events["rollout.rolled_back"]["details"]["figures"]
    assert figures["errors"] > figures["max_error_rate"] * figures["requests"]
    assert result.sent >= 0.8 * RATE * 4
    assert result.ok / result.sent >= 0.99, result.summary()
    # The bad version's replicas are removed once drained; answers come from the good one.
    wait_for(lambda: list(weights(server, "canary")) == [good], 60, "v2 undeployed", [])
    assert server.predict("user-a", "canary").json()["version"] == good


def test_a_healthy_version_is_promoted_through_every_step(
    server: ServingServer, tmp_path: Path
) -> None:
    old = serve_v1(server, "steady", tmp_path, replicas=2)
    new = register_mlp(server.store, "a", "steady", tmp_path, tag="v2")
    with load(server, "steady") as traffic:
        rollout = start(server, "steady", new, steps=[20, 50, 100], interval_s=4)
        done = wait_state(server, "steady", rollout["id"], "promoted", 120)
    print("load:", traffic.result.summary())
    kinds = [e["kind"] for e in done["events"]]
    assert kinds == ["rollout.started"] + ["rollout.step"] * 3 + ["rollout.promoted"]
    steps = [e["details"] for e in done["events"] if e["kind"] == "rollout.step"]
    assert [s["weight"] for s in steps] == [20, 50, 100]
    assert all(s["figures"]["errors"] == 0 for s in steps[1:])
    assert steps[1]["figures"]["requests"] >= 20  # the 20% step was judged on real traffic
    assert done["from_version"] == old and weights(server, "steady") == {new: 100.0}
    assert traffic.result.ok / traffic.result.sent >= 0.99, traffic.result.summary()


def test_a_rollout_survives_a_control_plane_crash(server: ServingServer, tmp_path: Path) -> None:
    serve_v1(server, "crash", tmp_path)
    new = register_mlp(server.store, "a", "crash", tmp_path, tag="v2")
    with load(server, "crash", rate=10):  # answers while the server is down are not judged
        rollout = start(server, "crash", new, steps=[25, 50, 100], interval_s=4)
        wait_for(lambda: show(server, "crash", rollout["id"])["step_index"] >= 1, 120, "step 1", [])
        server.process.kill()  # SIGKILL mid-rollout: no shutdown code runs
        server.process.start()
        server.process.wait_for(server.process.is_leader, 120, "the server to lead again")
        done = wait_state(server, "crash", rollout["id"], "promoted", 240)
    steps = [e["details"]["step_index"] for e in done["events"] if e["kind"] == "rollout.step"]
    assert steps == [0, 1, 2]  # resumed where it was: no step taken twice, none skipped
    assert weights(server, "crash") == {new: 100.0}


def _drift_scores(server: ServingServer) -> dict[str, float]:
    with server.client("admin") as admin:
        text = admin.get("/metrics").text
    scores = {}
    for line in text.splitlines():
        if line.startswith("aicluster_model_drift_score{"):
            labels, value = line.rsplit(" ", 1)
            model = labels.split('model="')[1].split('"')[0]
            scores[model] = float(value)
    return scores


def test_inputs_from_another_distribution_raise_the_drift_score(
    server: ServingServer, tmp_path: Path
) -> None:
    rng = random.Random(3)
    training = [rng.gauss(0, 1) for _ in range(5000)]
    reference = numeric_reference(training, bins=10, feature="x")
    for name in ("drift-in", "drift-out"):
        version = register_mlp(server.store, "a", name, tmp_path, drift=reference)
        server.deploy("user-a", name, version)
        server.wait_serving("user-a", name, version)
    for _ in range(60):
        for name, mean in (("drift-in", 0.0), ("drift-out", 3.0)):
            inputs = {"x": [rng.gauss(mean, 1) for _ in range(8)]}
            assert server.predict("user-a", name, inputs).status_code == 200
    scores = _drift_scores(server)
    print("drift scores:", scores)
    assert scores["drift-in"] < 0.3 < scores["drift-out"]

    def drift_events(name: str) -> list[Any]:
        found = server.store.audit("a")
        return [e for e in found if e.kind == "model.drift" and e.details.get("model") == name]

    wait_for(lambda: len(drift_events("drift-out")) == 1, 20, "the drift event", [])
    (event,) = drift_events("drift-out")
    assert event.details["score"] > 0.3 and event.details["feature"] == "x"
    for _ in range(20):  # more drifted traffic: still one event per crossing
        server.predict("user-a", "drift-out", {"x": [rng.gauss(3, 1) for _ in range(8)]})
    time.sleep(2)
    assert len(drift_events("drift-out")) == 1
    assert drift_events("drift-in") == []
