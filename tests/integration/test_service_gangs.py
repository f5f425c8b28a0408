"""Services in the scheduler, end to end: a deployment's replicas are jobs of kind ``service``
that the same scheduler places, under the tenant's quotas and the configuration's priority
rules, on the embedded multi-node Ray cluster, with a real server process (store, control loop,
deployer, gateway) and real HTTP.

- Tenant ``a`` has a quota of 1 GPU (no borrowing) and runs a 1-GPU batch job: its deployment
  with ``--gpus 1`` waits (PENDING; ``aicluster why`` names the quota), and once the batch job
  ends the replica starts on the node the scheduler chose and answers a prediction.
- With ``serving: {priority: high, preemptible: false}``, a cluster full of tenant ``b``'s batch
  jobs gives way: a batch job is preempted, the replica starts in its place, and the preempted
  job waits in the queue again.
- A CPU-only deployment of tenant ``c`` (a CPU quota of 1.5, a 1-CPU batch job running) waits
  the same way (``why`` names the CPUs), and is served on the scheduler's node once the batch
  job ends.
- Under load an autoscaled deployment asks the scheduler for replicas, never more than its
  maximum, and gives them back once the load has been lower for the configuration's
  ``serving.scale_down_after_s``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverproc import release_job_spec, wait_for
from serving import (
    LoadGenerator,
    ServingServer,
    mlp_inputs,
    placed_nodes,
    ray_node_name,
    register_mlp,
    replica_nodes,
    replicas,
    serving_server,
)
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.serve import app_name

pytestmark = pytest.mark.timeout(600)

#: The embedded cluster: 4 nodes of 8 simulated GPUs (see conftest's ``ray_cluster``).
NODES, CPUS_PER_NODE = 4, 8
SERVICES_FIRST = "serving:\n  priority: high\n  preemptible: false\n"


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingServer]:
    quotas = {
        "a": {"quota": {"sim-gpu": 1}, "borrow_limit": {"sim-gpu": 0}},
        "c": {"quota": {}, "cpu_quota": 1.5},
    }
    work = tmp_path_factory.mktemp("service-gangs")
    tenants = ("a", "b", "c")
    with serving_server(ray_cluster.address, work, tenants, quotas) as running:
        yield running


def submit_batch(server: ServingServer, who: str, spec: str) -> str:
    with server.client(who) as client:
        response = client.post(
            "/v1/jobs", content=spec, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def job(server: ServingServer, who: str, job_id: str) -> dict[str, Any]:
    with server.client(who) as client:
        response = client.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_state(server: ServingServer, who: str, job_id: str, state: str, what: str) -> None:
    wait_for(
        lambda: job(server, who, job_id)["state"] == state,
        180,
        what,
        [server.process],
        need_alive=True,
    )


def one_service(server: ServingServer, who: str, tenant: str, model: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def asked() -> bool:
        found[:] = [j for j in server.service_jobs(tenant, model, who) if j["state"] != "CANCELLED"]
        return len(found) == 1

    wait_for(asked, 60, f"one service job for {model}", [server.process], need_alive=True)
    return found[0]


def cli(server: ServingServer, who: str, *args: str) -> str:
    result = CliRunner().invoke(
        app, [*args, "--url", server.url, "--token", server.tokens[who]], terminal_width=200
    )
    assert result.exit_code == 0, result.output
    return str(result.output)


def test_a_replica_waits_for_its_tenants_quota_and_starts_when_a_job_ends(
    server: ServingServer, tmp_path: Path
) -> None:
    release = tmp_path / "release-a"
    spec = release_job_spec("batch-a", "a", release, workers=1, gpus=1)
    batch = submit_batch(server, "user-a", spec)
    wait_state(server, "user-a", batch, "RUNNING", "a's batch job to run")

    version = register_mlp(server.store, "a", "quoted", tmp_path, tag="quoted")
    login = ["--url", server.url, "--token", server.tokens["user-a"]]
    served = CliRunner().invoke(
        app,
        ["serve", f"quoted:{version}", "--gpus", "1", "--timeout", "3", *login],
    )
    assert "deploying quoted:1" in served.output
    said = " ".join(served.output.split())  # the error console folds its lines
    assert served.exit_code == 1 and "`aicluster why JOB` says why" in said, served.output
    replica = one_service(server, "user-a", "a", "quoted")
    assert replica["service"] == {"model": "quoted", "version": version}

    def over_quota() -> bool:
        found = job(server, "user-a", replica["id"])
        return found["state"] == "PENDING" and (found["pending"] or {}).get("code") == "over-quota"

    wait_for(over_quota, 60, "the replica to wait over quota", [server.process], need_alive=True)
    why = cli(server, "user-a", "why", replica["id"])
    assert "PENDING" in why and "over quota: tenant a uses 1 of 1" in why, why
    listed = cli(server, "user-a", "jobs", "--tenant", "a", "-o", "wide")
    assert "service" in listed and "batch" in listed, listed
    application = app_name("a", "quoted", version)
    assert replicas(application) == []  # no Serve replica while the scheduler has not admitted it
    assert server.predict("user-a", "quoted").status_code == 503

    release.write_text(json.dumps({}))  # the batch job ends: a's GPU is free again
    wait_state(server, "user-a", batch, "SUCCEEDED", "a's batch job to end")
    wait_state(server, "user-a", replica["id"], "RUNNING", "the replica to be admitted")
    server.wait_serving("user-a", "quoted", version)
    answer = server.predict("user-a", "quoted")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"]["tag"] == "quoted"
    # The Serve replica sits on the node the scheduler placed the service job on.
    placed = job(server, "user-a", replica["id"])["placement"]
    [slot] = placed["slots"]  # [node, gpus, nvlink domain, ...]
    node, gpus = slot[0], slot[1]
    assert gpus == 1
    [running] = replicas(application)
    assert ray_node_name(running["node_id"]) == node
    listed = cli(server, "user-a", "deployments")
    assert "quoted" in listed and "v1 1/1" in listed, listed

    # Undeploying gives the GPU back: the service job is cancelled.
    with server.client("user-a") as client:
        assert client.delete("/v1/deployments/quoted").status_code == 204
    wait_state(server, "user-a", replica["id"], "CANCELLED", "the replica's job to be cancelled")


def test_a_service_preempts_a_batch_job_when_the_configuration_says_so(
    server: ServingServer, tmp_path: Path
) -> None:
    with server.client("admin") as client:
        applied = client.put(
            "/v1/config",
            content=SERVICES_FIRST,
            headers={"Content-Type": "application/yaml"},
        )
    assert applied.status_code == 200, applied.text
    release = tmp_path / "release-b"
    batches = [
        submit_batch(
            server,
            "user-b",
            # A node's CPUs each (a GPU, one rank): the replica must preempt one to get in.
            release_job_spec(f"fill-{i}", "b", release, workers=1, cpus=CPUS_PER_NODE),
        )
        for i in range(NODES)
    ]
    try:
        for batch in batches:
            wait_state(server, "user-b", batch, "RUNNING", "the cluster to fill with batch jobs")
        version = register_mlp(server.store, "b", "urgent", tmp_path, tag="urgent")
        server.deploy("user-b", "urgent", version, gpus=1)
        replica = one_service(server, "user-b", "b", "urgent")
        assert replica["priority"] == 300 and replica["spec"]["preemptible"] is False
        wait_state(server, "user-b", replica["id"], "RUNNING", "the replica to preempt its way in")
        server.wait_serving("user-b", "urgent", version, timeout_s=180)
        answer = server.predict("user-b", "urgent")
        assert answer.status_code == 200, answer.text
        states = [job(server, "user-b", b)["state"] for b in batches]
        assert states.count("RUNNING") == NODES - 1, states
        [preempted] = [b for b, s in zip(batches, states, strict=True) if s != "RUNNING"]
        with server.client("user-b") as client:
            events = client.get(f"/v1/jobs/{preempted}/events").json()
        assert any(e["to_state"] == "PREEMPTING" for e in events), events
        # Back in the queue: the replica holds some of its node's CPUs, the others none.
        wait_state(server, "user-b", preempted, "PENDING", "the preempted job to wait again")
    finally:
        release.write_text(json.dumps({}))
        with server.client("user-b") as client:
            client.delete("/v1/deployments/urgent")


def test_load_asks_the_scheduler_for_replicas_within_the_range_and_gives_them_back(
    server: ServingServer, tmp_path: Path
) -> None:
    """The service scaler's one path end to end: under load an autoscaled version asks the
    scheduler for more replicas (service jobs), never over its maximum; Serve runs one replica
    per running job; without load they are given back after ``serving.scale_down_after_s``
    (5 s here; Little's law and the wait's own rule: ``test_serve_services.py``)."""
    with server.client("admin") as client:
        applied = client.put(
            "/v1/config",
            content="serving:\n  scale_down_after_s: 5\n",
            headers={"Content-Type": "application/yaml"},
        )
    assert applied.status_code == 200, applied.text
    # 250 ms a request at 10 a second: 2.5 in flight over a target of 1 a replica wants 3,
    # one over the maximum of 2. Few, slow requests: the gateway's and the load generator's CPU
    # is what a starting replica waits behind.
    version = register_mlp(server.store, "b", "busy", tmp_path, delay_ms=250)
    scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1.0}
    out = server.deploy("user-b", "busy", version, gpus=1, **scaling)
    assert out["versions"][0]["desired_replicas"] == "1-2"
    server.wait_serving("user-b", "busy", version)
    app = app_name("b", "busy", version)
    assert len(live_services(server, "b", "busy")) == 1  # no load: the minimum
    assert len(replicas(app)) == 1

    def healthy() -> int:
        return int(server.deployment("user-b", "busy")["versions"][0]["healthy_replicas"])

    path = "/v1/models/busy/predict"
    with LoadGenerator(server.url, server.tokens["user-b"], path, mlp_inputs(), 10.0) as load:

        def grown() -> bool:
            running = [j for j in live_services(server, "b", "busy") if j["state"] == "RUNNING"]
            return len(running) == 2 and healthy() == 2

        # A second Serve replica starts a process with torch: a minute on a machine loaded by
        # the other pytest worker, on top of the load window and the scheduler's admission.
        grew = wait_for(
            grown, 180, "a second replica under load", [server.process], need_alive=True
        )
        assert len(live_services(server, "b", "busy")) == 2  # never above the maximum
        assert len(replicas(app)) == 2  # a Serve replica per running service job
    print(f"grew to 2 replicas {grew:.0f} s into the load; {load.result.summary()}")
    assert load.result.error_rate <= 0.01, load.result.summary()
    shrank = wait_for(
        lambda: len(live_services(server, "b", "busy")) == 1 and len(replicas(app)) == 1,
        120,
        "the extra replica to be given back",
        [server.process],
        need_alive=True,
    )
    print(f"back to 1 replica {shrank:.0f} s after the load")
    wait_for(lambda: healthy() == 1, 30, "the API to report the one replica left", [])
    with server.client("user-b") as client:
        client.delete("/v1/deployments/busy")


def test_a_new_leader_keeps_a_running_replica(server: ServingServer, tmp_path: Path) -> None:
    """A crash of the server (SIGKILL) and its restart: the service job is adopted as RUNNING
    (not launched again, not failed), and its Serve replica is left as it is (the deployer
    finds it as wanted), so it answers throughout."""
    version = register_mlp(server.store, "b", "kept", tmp_path, tag="kept")
    server.deploy("user-b", "kept", version, gpus=1)
    server.wait_serving("user-b", "kept", version)
    [replica] = live_services(server, "b", "kept")
    application = app_name("b", "kept", version)
    [before] = replicas(application)
    server.process.kill()
    server.process.start()
    server.process.wait_for(server.process.is_leader, 60, "the restarted server to lead")
    server.wait_serving("user-b", "kept", version)
    assert server.predict("user-b", "kept").status_code == 200
    [after] = live_services(server, "b", "kept")
    assert (after["id"], after["state"], after["attempt"]) == (replica["id"], "RUNNING", 1)
    assert [r["replica_id"] for r in replicas(application)] == [before["replica_id"]]
    with server.client("user-b") as client:
        client.delete("/v1/deployments/kept")


def live_services(server: ServingServer, tenant: str, model: str) -> list[dict[str, Any]]:
    ended = ("CANCELLED", "FAILED", "SUCCEEDED")
    return [j for j in server.service_jobs(tenant, model) if j["state"] not in ended]


def test_bad_replica_resources_are_a_clear_4xx(server: ServingServer, tmp_path: Path) -> None:
    version = register_mlp(server.store, "a", "badgpus", tmp_path)
    with server.client("user-a") as client:
        for gpus in (-1, 99, "one", 1.5, True):
            response = client.post(
                "/v1/deployments", json={"model": "badgpus", "version": version, "gpus": gpus}
            )
            assert response.status_code == 422, (gpus, response.text)
            assert "gpus" in response.text
        # A whole number in range that no node of 8 GPUs could hold: a 400 that says so.
        too_big = client.post(
            "/v1/deployments", json={"model": "badgpus", "version": version, "gpus": 16}
        )
        assert too_big.status_code == 400, too_big.text
        assert "no node of this cluster can ever hold a replica" in too_big.json()["error"]
        for field, bad in (("cpus", 0), ("cpus", -1), ("cpus", "1"), ("memory_gb", -1)):
            response = client.post(
                "/v1/deployments", json={"model": "badgpus", "version": version, field: bad}
            )
            assert response.status_code == 422 and field in response.text, (field, bad)
        many = client.post(  # nodes of 8 CPUs: a 400 as for GPUs
            "/v1/deployments", json={"model": "badgpus", "version": version, "cpus": 12}
        )
        assert many.status_code == 400, many.text
        assert "no node of this cluster can ever hold a replica" in many.json()["error"]
        assert client.get("/v1/deployments/badgpus").status_code == 404  # nothing was stored
    login = ["--url", server.url, "--token", server.tokens["user-a"]]
    refused = CliRunner().invoke(app, ["serve", f"badgpus:{version}", "--cpus", "0", *login])
    said = " ".join(refused.output.split())
    assert refused.exit_code == 1 and "cpus" in said and "Traceback" not in said, said


def test_a_cpu_replica_waits_for_its_tenants_cpu_quota_and_serves_when_a_job_ends(
    server: ServingServer, tmp_path: Path
) -> None:
    release = tmp_path / "release-c"
    batch = submit_batch(
        server, "user-c", release_job_spec("batch-c", "c", release, workers=1, gpus=0)
    )
    wait_state(server, "user-c", batch, "RUNNING", "c's CPU batch job to run")

    version = register_mlp(server.store, "c", "small", tmp_path, tag="small")
    login = ["--url", server.url, "--token", server.tokens["user-c"]]
    options = ["--cpus", "1", "--memory-gb", "0.5", "--timeout", "3"]
    served = CliRunner().invoke(app, ["serve", f"small:{version}", *options, *login])
    said = " ".join(served.output.split())
    assert served.exit_code == 1 and "`aicluster why JOB` says why" in said, served.output
    replica = one_service(server, "user-c", "c", "small")
    held = replica["spec"]["resources"]  # the canonical spec leaves defaults out (1 CPU)
    assert (held.get("gpus", 0), held.get("cpus", 1.0), held["memory_gb"]) == (0, 1.0, 0.5)

    def over_quota() -> bool:
        found = job(server, "user-c", replica["id"])
        return found["state"] == "PENDING" and (found["pending"] or {}).get("code") == "over-quota"

    wait_for(over_quota, 60, "the replica to wait over quota", [server.process], need_alive=True)
    why = " ".join(cli(server, "user-c", "why", replica["id"]).split())
    assert "over quota: tenant c uses 1 of 1.5 CPUs and the job needs 1" in why, why
    assert server.predict("user-c", "small").status_code == 503  # no replica yet

    release.write_text(json.dumps({}))  # the batch job ends: c's CPU is free again
    wait_state(server, "user-c", replica["id"], "RUNNING", "the replica to be admitted")
    server.wait_serving("user-c", "small", version)
    answer = server.predict("user-c", "small")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"]["tag"] == "small"
    running = server.service_jobs("c", "small")
    assert replica_nodes(app_name("c", "small", version)) == placed_nodes(running)
    [slot] = job(server, "user-c", replica["id"])["placement"]["slots"]
    assert (slot[1], slot[3], slot[4]) == (0, 1.0, 0.5)  # no GPU; its CPU and memory
    with server.client("user-c") as client:
        assert client.delete("/v1/deployments/small").status_code == 204
    wait_state(server, "user-c", replica["id"], "CANCELLED", "the replica's job to be cancelled")
