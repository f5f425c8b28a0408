"""A crash with Ray work in flight, end to end: the server is SIGKILLed while a gang's launch
waits for Ray to reserve it. The restarted control loop finishes the same attempt (Ray's
placement group, still pending, is reused), instead of counting a failure and launching again.

The recovery rules for the other crashes (a preemption cut short, a gang preempted while its
launch waits, gangs left behind or launched by a deposed leader) run over the fake runtime in
``tests/unit/test_control_loop_recovery.py``; the Ray side of releasing leftovers in
``test_control_loop.py::test_at_start_the_loop_releases_gangs_no_job_owns``.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import (
    ServerProcess,
    admin_token,
    job_state,
    placement_group_state,
    release_job_spec,
    servers_cleanup,
    stop_gangs,
    write_tenants,
)

from aicluster.runtime import (
    LABEL_NODE,
    SIM_GPU_RESOURCE,
    RunDir,
    discover,
)
from aicluster.runtime.layout import gang_name

pytestmark = pytest.mark.integration

TENANTS: dict[str, dict[str, Any]] = {
    "team-a": {"quota": {"sim-gpu": 16}, "borrow_limit": {"sim-gpu": 16}},
}


@pytest.fixture
def server(ray_cluster: Any, tmp_path: Path) -> Iterator[ServerProcess]:
    state = tmp_path / "state"
    tenants = write_tenants(tmp_path / "tenants.json", TENANTS)
    started = ServerProcess(
        "server", state, tmp_path, ray_address=ray_cluster.address, tenants=tenants
    )
    releases = [tmp_path / "release"]
    with stop_gangs(state, *releases), servers_cleanup(started):
        started.start()
        started.wait_for(started.is_leader, 120, "the server to lead")
        yield started


def stored_states(server: ServerProcess) -> dict[str, str]:
    """Every job's state, read from the database file (the server may be down)."""
    with sqlite3.connect(server.state_dir / "aicluster.db") as connection:
        return dict(connection.execute("SELECT id, state FROM jobs").fetchall())


def transitions(client: httpx.Client, job_id: str) -> list[str]:
    events = client.get(f"/v1/jobs/{job_id}/events").json()
    return [event["to_state"] for event in events if event["kind"] == "job.transition"]


def submit(client: httpx.Client, spec: str) -> str:
    response = client.post("/v1/jobs", content=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@contextmanager
def held(bundles: list[dict[str, float]], node: str | None = None) -> Iterator[Callable[[], None]]:
    """A placement group of the test holds these Ray resources (on ``node``, else one bundle per
    node) behind the scheduler's back, so launches wait for Ray; yields how to give them back."""
    from ray.util.placement_group import placement_group, remove_placement_group

    if node is None:
        hog = placement_group(bundles, strategy="STRICT_SPREAD")
    else:
        hog = placement_group(bundles, bundle_label_selector=[{LABEL_NODE: node}] * len(bundles))
    assert hog.wait(60), f"the test could not reserve {bundles} in the Ray cluster"
    try:
        yield lambda: remove_placement_group(hog)
    finally:
        with contextlib.suppress(Exception):  # already removed when the test got that far
            remove_placement_group(hog)


def node_resource(node: str, name: str) -> float:
    return float(discover().nodes[node].resources[name])


def every_gpu_held() -> contextlib.AbstractContextManager[Callable[[], None]]:
    nodes = discover().nodes
    return held([{SIM_GPU_RESOURCE: node_resource(name, SIM_GPU_RESOURCE)} for name in nodes])


def removed(name: str) -> bool:
    return placement_group_state(name) in (None, "REMOVED")


def test_launch_cut_short_by_a_crash_is_finished(server: ServerProcess, tmp_path: Path) -> None:
    """Ray cannot reserve the gang yet (a placement group of the test holds every simulated GPU),
    so the launch is waiting when the server dies. After the restart the same attempt is
    launched to the end: no failure is recorded, no second attempt is made."""
    with every_gpu_held() as give_back:
        token = admin_token(server.state_dir)
        release = tmp_path / "release"
        with server.client(token) as client:
            spec = release_job_spec("late", "team-a", release, max_restarts=3)
            job_id = submit(client, spec)
            server.wait_for(
                lambda: placement_group_state(gang_name(job_id, 1)) == "PENDING",
                120,
                "the launch to wait for Ray",
            )
        server.kill()
        assert stored_states(server)[job_id] == "STARTING"

        server.start()
        server.wait_for(server.is_leader, 120, "the restarted server to lead")
        with server.client(token) as client:
            server.wait_for(
                lambda: client.get("/v1/cluster").json()["running_jobs"] == 1,
                120,
                "the restarted loop to adopt the job",
            )
            for _ in range(8):  # several ticks: the interrupted launch is not a failure
                record = client.get(f"/v1/jobs/{job_id}").json()
                assert (record["state"], record["attempt"]) == ("STARTING", 1), record
                time.sleep(0.5)
            give_back()
            server.wait_for(lambda: job_state(client, job_id) == "RUNNING", 180, "the gang")
            release.touch()
            server.wait_for(lambda: job_state(client, job_id) == "SUCCEEDED", 180, "success")
            record = client.get(f"/v1/jobs/{job_id}").json()
            assert (record["attempt"], record["restarts"]) == (1, 0), record
            assert transitions(client, job_id) == ["STARTING", "RUNNING", "SUCCEEDED"]
        assert RunDir.attempts(server.state_dir, job_id) == [1]
        server.wait_for(lambda: removed(gang_name(job_id, 1)), 120, "the gang's resources back")
