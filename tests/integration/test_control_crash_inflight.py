"""Crashes with Ray work in flight: the server is SIGKILLed while a gang is being launched, or
while a preempted gang is being stopped. The restarted control loop finishes what was started
(the same attempt), instead of counting a failure and launching the job again.
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
    JOBS,
    ServerProcess,
    admin_token,
    job_state,
    placement_group_state,
    release_job_spec,
    servers_cleanup,
    stop_gangs,
    write_tenants,
)

from aicluster.core import DomainLevel, Placement, Slot
from aicluster.runtime import (
    LABEL_NODE,
    SIM_GPU_RESOURCE,
    GangHandle,
    GangPhase,
    GangSpec,
    RunDir,
    Runtime,
    discover,
)
from aicluster.runtime.layout import gang_name

pytestmark = pytest.mark.integration

TENANTS: dict[str, dict[str, Any]] = {
    "team-a": {"quota": {"sim-gpu": 16}, "borrow_limit": {"sim-gpu": 16}},
    "idle": {"quota": {"sim-gpu": 0}, "borrow_limit": {"sim-gpu": 0}},  # its jobs never start
}


@pytest.fixture
def server(ray_cluster: Any, tmp_path: Path) -> Iterator[ServerProcess]:
    state = tmp_path / "state"
    tenants = write_tenants(tmp_path / "tenants.json", TENANTS)
    started = ServerProcess(
        "server", state, tmp_path, ray_address=ray_cluster.address, tenants=tenants
    )
    releases = [tmp_path / name for name in ("release", "release-low", "release-high")]
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


def only_node_0(server: ServerProcess, client: httpx.Client) -> None:
    """Cordon every node but node-0, so that a second gang there must preempt the first."""
    server.wait_for(
        lambda: len(client.get("/v1/nodes").json()) == 4, 120, "the nodes to be registered"
    )
    for node in ("node-1", "node-2", "node-3"):
        response = client.post(f"/v1/nodes/{node}/cordon")
        assert response.status_code == 200, response.text


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


def launch_behind_its_back(server: ServerProcess, job_id: str, release: Path) -> GangHandle:
    """Attempt 1 of ``job_id`` (``until_released.py``, one rank with a GPU on node-1), launched
    by the test itself, as a crashed or deposed leader would have left it."""
    gang = GangSpec(
        job_id=job_id,
        entrypoint="until_released.py",
        args=("--release", str(release)),
        placement=Placement((Slot("node-1", 1),), DomainLevel.NODE, "node-1"),
        gpus_per_worker=1,
        attempt=1,
        working_dir=str(JOBS),
    )
    return Runtime(server.state_dir, start_timeout_s=120).launch(gang)


def restart_until_released(server: ServerProcess, job_id: str, what: str) -> None:
    """Start ``server`` again, until it leads and attempt 1 of ``job_id`` (``what``) is gone."""
    server.start()
    server.wait_for(server.is_leader, 120, "the restarted server to lead")
    server.wait_for(lambda: removed(gang_name(job_id, 1)), 120, f"{what}'s release")


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


def test_preemption_cut_short_by_a_crash_is_finished(server: ServerProcess, tmp_path: Path) -> None:
    """Only node-0 is schedulable. A low-priority gang that ignores SIGTERM holds it (its 8
    CPUs: 2 workers of 4, a GPU each); a high-priority job (8 CPUs) preempts it, and the server
    dies while the stop waits out its grace period (the high job's launch waits for the CPUs
    meanwhile). After the restart the victim is stopped and requeued (not counted as a
    restart), and the preemptor's launch is finished."""
    token = admin_token(server.state_dir)
    with server.client(token) as client:
        only_node_0(server, client)
        low_spec = release_job_spec(
            "low",
            "team-a",
            tmp_path / "release-low",
            workers=2,
            cpus=4,
            priority="low",
            max_restarts=3,
            ignore_sigterm=True,
        )
        low = submit(client, low_spec)
        server.wait_for(lambda: job_state(client, low) == "RUNNING", 180, "the low job to run")
        high_spec = release_job_spec(
            "high", "team-a", tmp_path / "release-high", workers=1, cpus=8, priority="high"
        )
        high = submit(client, high_spec)
        server.wait_for(  # the stop waits out its 10 s grace meanwhile
            lambda: (job_state(client, low), job_state(client, high)) == ("PREEMPTING", "STARTING"),
            120,
            "the preemption",
        )
    server.kill()
    at_kill = stored_states(server)
    assert (at_kill[low], at_kill[high]) == ("PREEMPTING", "STARTING"), at_kill

    server.start()
    server.wait_for(server.is_leader, 120, "the restarted server to lead")
    with server.client(token) as client:
        server.wait_for(lambda: job_state(client, high) == "RUNNING", 240, "the high job to run")
        server.wait_for(lambda: job_state(client, low) == "PENDING", 120, "the victim's requeue")
        victim = client.get(f"/v1/jobs/{low}").json()
        assert (victim["attempt"], victim["restarts"]) == (1, 0), victim
        assert transitions(client, low) == ["STARTING", "RUNNING", "PREEMPTING", "PENDING"]
        assert removed(gang_name(low, 1)), "the victim's gang still holds its resources"
        assert client.post(f"/v1/jobs/{low}/cancel").json()["state"] == "CANCELLED"

        (tmp_path / "release-high").touch()
        server.wait_for(lambda: job_state(client, high) == "SUCCEEDED", 180, "the high job")
        record = client.get(f"/v1/jobs/{high}").json()
        assert (record["attempt"], record["restarts"]) == (1, 0), record
        assert transitions(client, high) == ["STARTING", "RUNNING", "SUCCEEDED"]
    assert RunDir.attempts(server.state_dir, high) == [1]
    assert RunDir.attempts(server.state_dir, low) == [1]


def test_preempted_while_launching_is_stopped_once_launched(
    server: ServerProcess, tmp_path: Path
) -> None:
    """No crash: a gang preempted while its launch waits for Ray cannot be stopped yet; it must be
    stopped as soon as the launch lands, or it runs on and its preemptor never gets the GPUs.

    Ray resources the test holds on node-0 set the order: its GPUs (both jobs wait), then all
    but 2 GiB of its memory (the preemptor needs 3 GiB, the victim 1), so the victim's launch
    lands first, and the preemptor can only start once the victim has been stopped. Each job
    asks node-0's 8 CPUs (a GPU a worker), so the second must preempt the first."""
    token = admin_token(server.state_dir)
    gpus = held([{SIM_GPU_RESOURCE: node_resource("node-0", SIM_GPU_RESOURCE)}], node="node-0")
    left = 2.0 * (1 << 30)  # memory left free on node-0: the victim fits (1 GiB), not the high job
    memory = held([{"memory": node_resource("node-0", "memory") - left}], node="node-0")
    with server.client(token) as client, gpus as give_gpus_back, memory as give_memory_back:
        only_node_0(server, client)
        low_spec = release_job_spec(
            "low", "team-a", tmp_path / "release-low", workers=2, cpus=4, priority="low"
        )
        low = submit(client, low_spec)
        server.wait_for(
            lambda: placement_group_state(gang_name(low, 1)) == "PENDING",
            120,
            "the low job's launch to wait for Ray",
        )
        high_spec = release_job_spec(
            "high",
            "team-a",
            tmp_path / "release-high",
            workers=1,
            cpus=8,
            memory_gb=3.0,
            priority="high",
        )
        high = submit(client, high_spec)
        server.wait_for(lambda: job_state(client, low) == "PREEMPTING", 120, "the preemption")
        give_gpus_back()
        server.wait_for(
            lambda: placement_group_state(gang_name(low, 1)) in ("CREATED", "REMOVED"),
            120,
            "Ray to reserve the low job's gang",
        )
        give_memory_back()
        server.wait_for(lambda: job_state(client, high) == "RUNNING", 240, "the high job to run")
        server.wait_for(lambda: job_state(client, low) == "PENDING", 120, "the victim's requeue")
        victim = client.get(f"/v1/jobs/{low}").json()
        assert (victim["attempt"], victim["restarts"]) == (1, 0), victim
        assert transitions(client, low) == ["STARTING", "PREEMPTING", "PENDING"]
        assert removed(gang_name(low, 1)), "the victim's gang still holds its resources"
        assert client.post(f"/v1/jobs/{low}/cancel").json()["state"] == "CANCELLED"
        (tmp_path / "release-high").touch()
        server.wait_for(lambda: job_state(client, high) == "SUCCEEDED", 180, "the high job")
        assert transitions(client, high) == ["STARTING", "RUNNING", "SUCCEEDED"]


def test_a_gang_left_behind_by_a_crash_is_released(server: ServerProcess, tmp_path: Path) -> None:
    """A crash between a job's end and its gang's release leaves a gang whose ranks have exited
    but whose actors and placement group still hold Ray's GPUs. The restarted loop releases it.
    (The test makes such a gang itself: a finished attempt of a cancelled job.)"""
    token = admin_token(server.state_dir)
    release = tmp_path / "release"
    release.touch()
    with server.client(token) as client:
        job_id = submit(client, release_job_spec("gone", "idle", release, workers=1))
        assert client.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "CANCELLED"
    server.kill()

    leftover = launch_behind_its_back(server, job_id, release)
    assert leftover.wait(timeout_s=120).phase is GangPhase.SUCCEEDED
    assert placement_group_state(gang_name(job_id, 1)) == "CREATED"

    restart_until_released(server, job_id, "the leftover gang")


def test_a_gang_of_a_queued_job_is_released_by_a_new_leader(
    server: ServerProcess, tmp_path: Path
) -> None:
    """What a deposed leader launched after its last write (e.g. frozen mid-launch, woken after
    the new leader requeued the job): a running gang of a job the store has PENDING. The new
    leader's start-up reconciliation releases it (its ranks are stopped, its placement group
    removed), and the job stays queued, untouched."""
    token = admin_token(server.state_dir)
    release = tmp_path / "release"  # never touched while it matters: the gang would run on
    with server.client(token) as client:
        job_id = submit(client, release_job_spec("queued", "idle", release, workers=1))
    server.kill()

    stray = launch_behind_its_back(server, job_id, release)
    assert stray.status().phase is GangPhase.RUNNING

    restart_until_released(server, job_id, "the stray gang")
    assert stray.status().phase is not GangPhase.RUNNING
    with server.client(token) as client:
        job = client.get(f"/v1/jobs/{job_id}").json()
        assert (job["state"], job["attempt"]) == ("PENDING", 0), job
        assert transitions(client, job_id) == []
