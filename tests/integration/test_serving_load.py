"""Serving under load on a real multi-node Ray cluster (server process, Serve replicas, HTTP):

* a rolling update (``serve NAME:V2`` on a deployment serving V1) under a fixed request rate
  loses at most 0.1% of requests (lost: any answer but a 200, a dropped connection, or none
  within the client's 45 s, which is above the gateway's own bound of 30 s, so that a slow
  answer on a loaded machine is the server's to give); a run whose load generator fell below
  80% of its rate measured an overloaded machine: it is void and runs again, once;
* a replica killed every 10 s under load: at least 99.9% of requests succeed (one client retry);
* every replica unhealthy: each answer is a 503 in under a second (no hang), and the service
  recovers once a replica is healthy again.

The open-loop rate is ``AICLUSTER_TEST_SERVE_RATE`` requests/s (default 200), capped at half (a
quarter during a rolling update, whose new replicas start on the same cores) of what the
machine sustains at the time (measured first with closed-loop clients): this 2-core
machine is shared by the server, Ray, the replicas, the load generator and other work, and a
test that overloads it measures the overload. The rates are printed.
``AICLUSTER_TEST_SERVE_SHARE=1`` lifts the cap to the whole measured capacity (a quiet machine).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import wait_for
from serving import (
    LoadGenerator,
    ServingServer,
    capacity,
    kill_replica,
    mlp_inputs,
    register_mlp,
    replica_actors,
    serving_server,
)

from aicluster.serve import app_name

pytestmark = pytest.mark.timeout(900)

RATE = float(os.environ.get("AICLUSTER_TEST_SERVE_RATE", "200"))
# Overrides each test's share of the measured capacity (1 = no cap below the capacity): for a
# quiet or bigger machine, to show the target rate itself.
SHARE = os.environ.get("AICLUSTER_TEST_SERVE_SHARE")


#: The gateway's bound on a prediction here (``--predict-timeout-s``; 30 s by default): well above
#: any answer under this module's load, and a slow model's test waits this long.
PREDICT_TIMEOUT_S = 12.0


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingServer]:
    work = tmp_path_factory.mktemp("load")
    timeout = ("--predict-timeout-s", str(PREDICT_TIMEOUT_S))
    with serving_server(ray_cluster.address, work, extra_args=timeout) as running:
        yield running


@pytest.fixture(autouse=True)
def _undeploy_after(server: ServingServer) -> Iterator[None]:
    """Each test's models stop serving when it ends (``undeploy_all``): a later test measures
    the machine's capacity without an earlier one's replicas beside it."""
    yield
    server.undeploy_all("user-a")


def _load(
    server: ServingServer, model: str, retry: bool = False, share: float = 0.5
) -> LoadGenerator:
    path = f"/v1/models/{model}/predict"
    fraction = float(SHARE) if SHARE else share
    # The other pytest worker's test can take the cores for seconds (9 requests/s measured
    # once, against 94 quiet): measure again, up to three times, before giving up.
    sustained = capacity(server.url, server.tokens["user-a"], path)
    for _ in range(2):
        if sustained * fraction >= 5:
            break
        time.sleep(5)
        sustained = max(sustained, capacity(server.url, server.tokens["user-a"], path))
    rate = min(RATE, sustained * fraction)
    print(f"capacity {sustained:.0f} req/s (closed loop, 4 clients): load at {rate:.0f} req/s")
    assert rate >= 5, f"the machine sustains only {sustained:.0f} req/s"
    return LoadGenerator(server.url, server.tokens["user-a"], path, mlp_inputs(), rate, retry=retry)


def test_rolling_update_under_load_loses_at_most_a_thousandth(
    server: ServingServer, tmp_path: Path
) -> None:
    first = register_mlp(server.store, "a", "roll", tmp_path, tag="v1")
    server.deploy("user-a", "roll", first, replicas=2)
    server.wait_serving("user-a", "roll", first)
    # A run is void when this process's load generator fell below 80% of its own rate: the
    # machine was overloaded, and the run measured that (CI, once: 14 of 33 requests/s sent,
    # p99 144 s). It runs again, once, from the version the void run promoted.
    for tag in ("v2", "v3"):
        second = register_mlp(server.store, "a", "roll", tmp_path, tag=tag)
        load = _rolling_update(server, first, second)
        print(f"rolling update at {load.achieved_rate:.0f} req/s: {load.result.summary()}")
        if load.achieved_rate >= 0.8 * load.rate:
            break
        first = second
    assert load.achieved_rate >= 0.8 * load.rate, "the machine was overloaded twice"
    result = load.result
    assert result.sent > 5 * load.rate * 0.8
    assert result.error_rate <= 0.001, result.summary()
    answer = server.predict("user-a", "roll").json()
    assert answer["version"] == second and answer["outputs"]["tag"] == tag
    wait_for(
        lambda: not replica_actors(app_name("a", "roll", first)), 60, "the old version to go", []
    )


def _rolling_update(server: ServingServer, first: int, second: int) -> LoadGenerator:
    """``serve roll:second`` over ``first`` under load; the load, ended 3 s after the promotion."""
    # A quarter of the capacity: the new version's replicas start (and import torch) on the
    # same two cores while the load runs.
    with _load(server, "roll", share=0.25) as load:
        time.sleep(3)
        out = server.deploy("user-a", "roll", second, replicas=2)
        assert out["promote_to"] == second
        assert {v["version"]: v["weight"] for v in out["versions"]} == {first: 100, second: 0}
        server.wait_serving("user-a", "roll", second)  # promoted, and the old version removed
        time.sleep(3)
    return load


def test_replica_killed_every_10s_under_load(server: ServingServer, tmp_path: Path) -> None:
    version = register_mlp(server.store, "a", "chaos", tmp_path)
    # Four replicas: a replacement (a new process importing torch) took over 20 s to start on
    # this loaded machine, so three kills 10 s apart could leave none with fewer.
    server.deploy("user-a", "chaos", version, replicas=4)
    server.wait_serving("user-a", "chaos", version)
    app = app_name("a", "chaos", version)
    rng = random.Random(5)
    killed = []
    with _load(server, "chaos", retry=True, share=0.25) as load:
        for _ in range(3):
            time.sleep(10)
            killed.append(kill_replica(app, rng))
        time.sleep(5)
    result = load.result
    print(f"kills {killed} at {load.achieved_rate:.0f} req/s: {result.summary()}")
    assert all(killed), "a replica to kill each time"
    assert result.ok / result.sent >= 0.999, result.summary()


def test_all_replicas_unhealthy_fast_503_then_recovery(
    server: ServingServer, tmp_path: Path
) -> None:
    flag = tmp_path / "unhealthy"
    version = register_mlp(server.store, "a", "sick", tmp_path, unhealthy_flag=str(flag))
    server.deploy("user-a", "sick", version, replicas=2)
    server.wait_serving("user-a", "sick", version)
    assert server.predict("user-a", "sick").status_code == 200
    flag.touch()
    wait_for(
        lambda: server.predict("user-a", "sick").status_code == 503,
        60,
        "503s once every replica fails its health check",
        [server.process],
    )
    answers = []
    with server.client("user-a") as client:
        for _ in range(20):
            started = time.monotonic()
            response = client.post("/v1/models/sick/predict", json=mlp_inputs())
            answers.append((response.status_code, time.monotonic() - started))
    assert {code for code, _ in answers} == {503}, answers
    assert max(seconds for _, seconds in answers) < 1.0, answers
    assert response.headers.get("retry-after") == "1"
    assert "no healthy replica" in response.json()["error"]
    assert server.deployment("user-a", "sick")["versions"][0]["healthy_replicas"] == 0
    flag.unlink()
    waited = wait_for(
        lambda: server.predict("user-a", "sick").status_code == 200,
        120,
        "the service to recover",
        [server.process],
    )
    print(f"recovered {waited:.1f}s after the flag was removed")


def test_requests_never_hang_past_the_timeout(server: ServingServer, tmp_path: Path) -> None:
    """A model slower than the gateway's timeout answers 504 once the timeout has passed, not a
    hang (this server's timeout is PREDICT_TIMEOUT_S; this model sleeps 10 s longer)."""
    slower_ms = int((PREDICT_TIMEOUT_S + 10) * 1000)
    version = register_mlp(server.store, "b", "slow", tmp_path, delay_ms=slower_ms)
    server.deploy("user-b", "slow", version)
    server.wait_serving("user-b", "slow", version)
    started = time.monotonic()
    with server.client("user-b", timeout_s=60) as client:
        try:
            response = client.post("/v1/models/slow/predict", json=mlp_inputs())
        except httpx.ReadTimeout:
            pytest.fail("the gateway did not answer within 60 s")
    took = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert PREDICT_TIMEOUT_S <= took < PREDICT_TIMEOUT_S + 5, took
