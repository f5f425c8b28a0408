"""Leader election between two real server processes on one PostgreSQL store and one Ray cluster.

Both serve the API; exactly one (the holder of the leader lease, a row of the store) runs the
control loop. When the leader is SIGKILLed its renewals stop, and the standby takes over once the
lease has expired: it adopts the gang the old leader launched (same attempt, not relaunched) and
starts the job that was queued. When the leader is cut off from the database (a network
partition), it steps down when it can no longer renew, the standby takes over, and once the
network heals the old leader stands by and takes over in turn when needed. (Freezing the leader,
and fencing its writes: ``test_control_fencing.py``.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fencing import TEST_LEASE_S
from serverproc import (
    ServerProcess,
    TcpProxy,
    admin_token,
    pg_schema,
    release_job_spec,
    servers_cleanup,
    stop_gangs,
    wait_for,
    write_tenants,
)
from sqlalchemy.engine import make_url

from aicluster.runtime import RunDir

pytestmark = pytest.mark.integration

# team-b may hold 8 GPUs and borrow none: its second job waits until the first one is done.
TENANTS = {"team-b": {"quota": {"sim-gpu": 2}, "borrow_limit": {"sim-gpu": 0}}}


def releases(tmp_path: Path) -> tuple[Path, Path]:
    """Release files of the first and the queued job."""
    return tmp_path / "release-first", tmp_path / "release-queued"


@dataclass
class Pair:
    a: ServerProcess
    b: ServerProcess
    link: TcpProxy  # between server a and the database
    state: Path
    db_url: str
    token: str = ""

    @property
    def servers(self) -> list[ServerProcess]:
        return [self.a, self.b]

    def leaders(self) -> list[str]:
        return [s.name for s in self.servers if s.is_leader()]

    def context(self) -> str:
        return "".join(server.context() for server in self.servers)


@pytest.fixture
def pair(ray_cluster: Any, pg_database: str, tmp_path: Path) -> Iterator[Pair]:
    """Server a (the leader, reaching the database through a proxy) and server b (standby) on
    one store, one Ray cluster and one state directory (run directories are shared, as on a
    shared filesystem)."""
    state = tmp_path / "state"
    tenants = write_tenants(tmp_path / "tenants.json", TENANTS)
    with pg_schema(pg_database) as db_url:
        url = make_url(db_url)
        link = TcpProxy((url.host or "127.0.0.1", url.port or 5432)).heal()
        a, b = (
            ServerProcess(
                name,
                state,
                tmp_path,
                ray_address=ray_cluster.address,
                db_url=server_url,
                tenants=tenants,
                extra_args=("--lease-s", str(TEST_LEASE_S)),
            )
            for name, server_url in (("server-a", link.url_for(db_url)), ("server-b", db_url))
        )
        with stop_gangs(state, *releases(tmp_path)), servers_cleanup(a, b):
            a.start()
            a.wait_for(a.is_leader, 120, "server a to lead")
            b.start()  # after a leads: which one leads is then known
            found = Pair(a, b, link, state, db_url, admin_token(state))
            for _ in range(6):  # b contends every second and must keep losing
                assert found.leaders() == ["server-a"], found.context()
                time.sleep(0.5)
            yield found
        link.cut()


def submit(server: ServerProcess, token: str, spec: str) -> str:
    with server.client(token) as client:
        response = client.post("/v1/jobs", content=spec)
    assert response.status_code == 201, response.text + server.context()
    return str(response.json()["id"])


def get_job(server: ServerProcess, token: str, job_id: str) -> dict[str, Any]:
    with server.client(token) as client:
        return dict(client.get(f"/v1/jobs/{job_id}").json())


def transitions(server: ServerProcess, token: str, job_id: str) -> list[str]:
    with server.client(token) as client:
        events = client.get(f"/v1/jobs/{job_id}/events").json()
    return [event["to_state"] for event in events if event["kind"] == "job.transition"]


def running_and_queued(pair: Pair, tmp_path: Path) -> tuple[str, str, Path]:
    """A gang running under server a and a job queued behind it (submitted to the standby);
    returns their ids and the first one's release file."""
    release, queued_release = releases(tmp_path)
    first = submit(pair.a, pair.token, release_job_spec("first", "team-b", release))
    pair.a.wait_for(
        lambda: get_job(pair.a, pair.token, first)["state"] == "RUNNING", 180, "the first job"
    )
    queued_release.touch()  # it ends as soon as it runs
    spec = release_job_spec("queued", "team-b", queued_release, workers=1)  # over the quota
    queued = submit(pair.b, pair.token, spec)  # a standby's API stores it for the leader
    pair.a.wait_for(
        lambda: (get_job(pair.a, pair.token, queued)["pending"] or {}).get("code") == "over-quota",
        60,
        "the leader to queue the job submitted to the standby",
    )
    return first, queued, release


def finish(pair: Pair, leader: ServerProcess, first: str, queued: str, release: Path) -> None:
    """The first gang was adopted, not relaunched; both jobs end SUCCEEDED under ``leader``."""
    run = RunDir(pair.state, first, 1)

    def step() -> int:
        return max((r.step or 0 for r in run.telemetry(0) if r.kind == "step"), default=0)

    steps = step()
    leader.wait_for(
        lambda: step() >= steps + 3,
        120,
        "the first gang to keep training",
    )
    release.touch()
    for job_id in (first, queued):
        leader.wait_for(
            lambda job_id=job_id: get_job(leader, pair.token, job_id)["state"] == "SUCCEEDED",
            240,
            f"{job_id} to succeed",
        )
    record = get_job(leader, pair.token, first)
    assert record["attempt"] == 1 and record["restarts"] == 0, record
    assert RunDir.attempts(pair.state, first) == [1], "the first gang was relaunched"
    for job_id in (first, queued):
        moves = transitions(leader, pair.token, job_id)
        assert moves == ["STARTING", "RUNNING", "SUCCEEDED"], (job_id, moves)


def test_standby_takes_over_when_the_leader_is_killed(pair: Pair, tmp_path: Path) -> None:
    first, queued, release = running_and_queued(pair, tmp_path)

    pair.a.kill()
    took = wait_for(pair.b.is_leader, 120, "server b to take over", pair.servers)
    print(f"server b leads {took:.1f}s after server a was killed")
    with pair.b.client(pair.token) as client:
        pair.b.wait_for(
            lambda: client.get("/v1/cluster").json()["running_jobs"] >= 1,
            120,
            "server b to adopt the running gang",
        )
    finish(pair, pair.b, first, queued, release)

    pair.a.start()  # the old leader comes back as a standby
    for _ in range(6):
        assert pair.leaders() == ["server-b"], pair.context()
        time.sleep(0.5)


def test_partitioned_leader_steps_down_and_stands_by(pair: Pair, tmp_path: Path) -> None:
    first, queued, release = running_and_queued(pair, tmp_path)

    pair.link.cut()  # server a loses the database: it cannot renew, so it stands down
    wait_for(
        lambda: pair.leaders() == ["server-b"],
        120,
        "server a to step down and server b to lead",
        pair.servers,
        need_alive=True,
    )
    with pair.b.client(pair.token) as client:
        pair.b.wait_for(
            lambda: client.get("/v1/cluster").json()["running_jobs"] >= 1,
            120,
            "server b to adopt the running gang",
        )
    time.sleep(3)  # server a keeps failing to reach the database meanwhile, and must not give up
    pair.link.heal()
    for _ in range(6):  # reconnected, server a stands by
        assert pair.leaders() == ["server-b"], pair.context()
        time.sleep(0.5)
    finish(pair, pair.b, first, queued, release)

    pair.b.kill()  # server a still contends: it takes over
    took = wait_for(pair.a.is_leader, 120, "server a to take over again", [pair.a])
    print(f"server a leads again {took:.1f}s after server b was killed")
