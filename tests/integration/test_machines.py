"""Three machines made of network namespaces (:mod:`machines`), joined as ``docs/deploy.md``
says: the Ray head with its topology labels in one, the others joining it with their own, token
authentication throughout. The control plane runs in the host namespace beside its PostgreSQL
store (on loopback), as a Ray node without labels (a driver needs a local raylet) and reaches the
machines over the bridge; jobs run in their tenant's sandbox on the machines.

A two-worker DDP job (gloo, simulated GPUs, checkpoints) spans two machines; one of them is torn
down mid-run (its processes killed, its namespace deleted), and the job resumes from its
checkpoint on the third machine and succeeds."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chaos import host_pid
from machines import Network, unavailable
from serverproc import (
    REPO,
    ServerProcess,
    admin_token,
    pg_schema,
    servers_cleanup,
    telemetry_steps,
    write_tenants,
)
from shipping import EXAMPLES, ship

from aicluster.core import Node
from aicluster.runtime import RunDir
from aicluster.runtime.labels import NO_METRICS_EXPORT
from aicluster.store import placement_from_json

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TENANT = "team-m"
# One simulated GPU a machine, so a two-worker job spans two machines; machine-1 and machine-2
# share a rack (the scheduler packs the job there), machine-3 is the spare in another.
NODES = [
    Node("machine-1", 1, "sim-gpu", "rack-0", "pod-0", cpus=2, memory_gb=4),
    Node("machine-2", 1, "sim-gpu", "rack-0", "pod-0", cpus=2, memory_gb=4),
    Node("machine-3", 1, "sim-gpu", "rack-1", "pod-0", cpus=2, memory_gb=4),
]
# The head declares a silent node dead after ~3 s. Ray's defaults wait longer: checks every 3 s,
# 5 failures, and each check to a machine that vanished from the network (no refusal comes
# back) waits out a 10 s timeout. (One --system-config: this one replaces ray_start_command's.)
HEALTH = json.dumps(
    {
        **NO_METRICS_EXPORT,
        "health_check_period_ms": 1000,
        "health_check_timeout_ms": 1000,
        "health_check_failure_threshold": 3,
    }
)
STEPS, CHECKPOINT_EVERY = 60, 5


@dataclass
class Cluster:
    network: Network
    server: ServerProcess
    token: str

    def context(self) -> str:
        return f"{self.server.context()}{self.network.context()}"

    def get(self, path: str) -> Any:
        with self.server.client(self.token, timeout_s=30) as client:
            response = client.get(path)
        assert response.status_code == 200, response.text + self.context()
        return response.json()


def machine_env() -> dict[str, str]:
    """What every machine's Ray node and the control plane start with: Ray bound to their own
    address (not 127.0.0.1), and the session's Ray token (``RAY_AUTH_MODE``, set for the
    session by tests/conftest.py, as docs/deploy.md has it set on every machine)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    assert env.get("RAY_AUTH_MODE") == "token" and env.get("RAY_AUTH_TOKEN_PATH")
    return {**env, "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def cluster(pg_database: str, tmp_path: Path) -> Iterator[Cluster]:
    why = unavailable()
    if why is not None:
        pytest.skip(f"cannot make network namespaces here: {why}")
    network = Network(tmp_path, NODES)
    state = tmp_path / "state"
    try:
        network.make()
        env = machine_env()
        head, *others = network.machines
        head.ray_start(None, env, system_config=HEALTH)
        for machine in others:
            machine.ray_start(f"{head.address}:6379", env)
        # The control plane's machine: a Ray node without labels, used for no job.
        network.host.ray_start(f"{head.address}:6379", env)
        tenants = write_tenants(tmp_path / "tenants.json", {TENANT: {"quota": {"sim-gpu": 3}}})
        with pg_schema(pg_database) as db_url:
            server = ServerProcess(
                "control-plane",
                state,
                tmp_path,
                ray_address=f"{head.address}:6379",
                db_url=db_url,
                tenants=tenants,
                sandbox=True,
                launcher=network.host.enter(REPO),
                environ=env,
            )
            with servers_cleanup(server):
                server.start()
                server.wait_for(server.is_leader, 120, "the control plane to lead")
                found = Cluster(network, server, admin_token(state))
                server.wait_for(
                    lambda: {n["name"] for n in found.get("/v1/nodes")} == {n.name for n in NODES},
                    120,
                    "the three machines to register",
                )
                yield found
    finally:
        network.teardown()


def placed_on(cluster: Cluster, job_id: str) -> set[str]:
    placement = cluster.get(f"/v1/jobs/{job_id}")["placement"]
    assert placement is not None, f"{job_id} is not placed"
    return {slot.node for slot in placement_from_json(placement).slots}


def ran_on(state: Path, job_id: str, attempt: int) -> set[str]:
    """The machines the attempt's ranks reported from (their processes' own node label)."""
    run = RunDir(state, job_id, attempt)
    return {r.node or "" for rank in range(2) for r in run.telemetry(rank) if r.kind == "start"}


def rank_uids(run: RunDir) -> list[int]:
    """The uid each rank's process runs as, seen from the host (which sees every machine's
    processes; a rank reports its pid in its sandbox's PID namespace)."""
    uids = []
    for rank in range(2):
        start = next(r for r in run.telemetry(rank) if r.kind == "start")
        pid = host_pid(int(start.metrics["pid"]), run.log_file(rank))
        found = re.search(r"^Uid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
        assert found is not None
        uids.append(int(found.group(1)))
    return uids


def test_a_job_spans_two_machines_and_recovers_on_the_third(cluster: Cluster) -> None:
    server, state = cluster.server, cluster.server.state_dir
    spec = {
        "name": "across-machines",
        "tenant": TENANT,
        "entrypoint": "ddp_mlp.py",
        "code": ship(state, TENANT, EXAMPLES),
        "workers": 2,
        "max_restarts": 5,  # a launch onto machine-2 before Ray declares it dead costs one
        "args": [
            *("--steps", str(STEPS), "--step-sleep", "0.25", "--seed", "1"),
            *("--checkpoint-every", str(CHECKPOINT_EVERY), "--deterministic"),
        ],
        "resources": {"gpus": 1, "cpus": 1, "memory_gb": 1, "gpu_type": "sim-gpu"},
        "checkpoint_interval": CHECKPOINT_EVERY * 0.25,
        "env": {"OMP_NUM_THREADS": "1"},
    }
    with server.client(cluster.token) as client:
        response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    job_id = str(response.json()["id"])

    first = RunDir(state, job_id, 1)
    server.wait_for(
        lambda: min(map(len, telemetry_steps(first, 2))) >= 3 * CHECKPOINT_EVERY,
        240,
        "the job to train on two machines",
    )
    assert placed_on(cluster, job_id) == {"machine-1", "machine-2"}, cluster.context()
    assert ran_on(state, job_id, 1) == {"machine-1", "machine-2"}, cluster.context()
    uids = rank_uids(first)  # sandboxed: each rank runs as its tenant's uid
    assert len(uids) == 2 and all(300_000 <= uid < 400_000 for uid in uids), uids

    torn_at, torn_step = time.time(), max(telemetry_steps(first, 2)[0])
    cluster.network.tear_down(cluster.network.machine("machine-2"))

    server.wait_for(
        lambda: cluster.get(f"/v1/jobs/{job_id}")["state"] == "SUCCEEDED",
        240,
        "the job to recover and succeed",
    )
    job = cluster.get(f"/v1/jobs/{job_id}")
    assert job["attempt"] >= 2 and job["restarts"] >= 1, job
    assert placed_on(cluster, job_id) == {"machine-1", "machine-3"}, job
    assert ran_on(state, job_id, job["attempt"]) == {"machine-1", "machine-3"}
    last = RunDir(state, job_id, job["attempt"])
    resumed = [r.step or 0 for r in last.telemetry(0) if r.kind == "resume"]
    assert resumed and resumed[0] >= CHECKPOINT_EVERY, resumed  # from a checkpoint, not step 0
    assert max(telemetry_steps(last, 2)[0]) == STEPS
    steps = [r.time for r in last.telemetry(0) if r.kind == "step"]
    print(
        f"machine-2 torn down at step {torn_step}; attempt {job['attempt']} resumed from step "
        f"{resumed[0]} on machine-1 and machine-3, training again {steps[0] - torn_at:.1f} s "
        f"later, and succeeded {time.time() - torn_at:.1f} s later"
    )
    # The control plane saw the machine go: it is no longer a healthy node.
    nodes = {n["name"]: n for n in cluster.get("/v1/nodes")}
    assert nodes["machine-2"]["health"] != "healthy", nodes
