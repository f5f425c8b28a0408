"""A failed job explains itself over the API and the CLI, against a real server: ``GET
/v1/jobs/{id}`` and ``GET /v1/jobs`` carry its ``failure`` (first failed rank, node, exit code or
signal, its stderr's last lines), ``why`` gives the failure instead of its placement, and
``aicluster jobs`` and ``why`` show it at 80 columns.

The plane is a standby (no control loop); the failure is stored as the loop stores it (the loop's
side: ``tests/unit/test_control_failures.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from apiserver import RunningServer, open_plane, serve, users
from liveplane import submit
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import JobState, Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

TAIL = [
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 20, in <module>',
    "<script>alert(1)</script>",  # text, as the job wrote it: the dashboard escapes it
    "ValueError: loss is nan at step 20",
]
FAILURE = {
    "rank": 1,
    "node": "node-7",
    "summary": "rank 1 on node-7 exited with code 1",
    "exit_code": 1,
    "signal": None,
    "lost": False,
    "attempt": 2,
    "stderr_tail": TAIL,
}
MESSAGE = f"rank 1 on node-7 exited with code 1: {TAIL[-1]} (after 1 restart)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    plane = open_plane(tmp_path_factory.mktemp("state"))
    store = plane.store
    store.create_tenant(Tenant("a"), "test")
    tokens = users(store, {"alice": ("a", Role.VIEWER)})
    job_id = submit(store, "a", "raises", workers=2, gpus=8)
    for to_state in (JobState.STARTING, JobState.RUNNING):
        store.transition(job_id, to_state, "control-loop")
    store.transition(
        job_id, JobState.FAILED, "control-loop", reason=MESSAGE, exit_code=1, failure=FAILURE
    )
    with serve(plane) as url:
        yield RunningServer(url, plane, tokens), job_id
    store.close()


def test_the_job_record_and_the_listing_carry_its_failure(
    server: tuple[RunningServer, str],
) -> None:
    running, job_id = server
    with running.client("alice") as client:
        job = client.get(f"/v1/jobs/{job_id}").json()
        listed = client.get("/v1/jobs", params={"state": "FAILED"}).json()["jobs"]
        why = client.get(f"/v1/jobs/{job_id}/why").json()
    assert job["failure"] == FAILURE and job["exit_code"] == 1
    assert [entry["failure"] for entry in listed] == [FAILURE]
    assert why["state"] == "FAILED" and why["reason"] == MESSAGE and why["failure"] == FAILURE


def test_the_cli_shows_it_at_80_columns(server: tuple[RunningServer, str]) -> None:
    running, job_id = server
    login = ["--url", running.url, "--token", running.tokens["alice"]]
    runner = CliRunner()
    why = runner.invoke(app, ["why", job_id, *login], env={"COLUMNS": "80"})
    jobs = runner.invoke(app, ["jobs", *login], env={"COLUMNS": "80"})
    assert why.exit_code == 0, why.output
    assert "failed: rank 1 on node-7 (attempt 2), exit code 1" in why.stdout
    assert "    ValueError: loss is nan at step 20\n" in why.stdout
    assert "placement score" not in why.stdout
    assert jobs.exit_code == 0, jobs.output
    assert all(len(line.rstrip()) <= 80 for line in jobs.stdout.splitlines()), jobs.stdout
    assert "exit 1: ValueError: loss is nan" in " ".join(jobs.stdout.split())
