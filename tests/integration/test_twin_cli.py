"""``aicluster twin export`` against a real server over a live control loop (no Ray): it writes
the three files ``aicluster sim`` replays; a malformed window is a 4xx, a non-admin a 403."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import RunningServer, serve
from liveplane import leading, open_live_plane, racks, submit, users, wait_for
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import JobState, Tenant
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Role

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    config = SchedulerConfig(queue="fifo", backfill="easy", preemption=False)
    plane = open_live_plane(tmp_path, [Tenant("a"), Tenant("b")], racks(1, 2, 2), config)
    tokens = users(plane.store, {"alice": ("a", Role.ADMIN)})
    with leading(plane), serve(plane) as url:
        yield RunningServer(url, plane, tokens)
    plane.store.close()


def finish(server: RunningServer, job_id: str) -> None:
    """Let the loop start ``job_id``, then end it as its gang would."""
    store = server.plane.store
    wait_for(lambda: store.get_job(None, job_id).state is JobState.STARTING, "admission")
    store.transition(job_id, JobState.RUNNING, "runtime", expected_from=JobState.STARTING)
    store.transition(job_id, JobState.SUCCEEDED, "runtime", expected_from=JobState.RUNNING)


def test_twin_export_writes_what_sim_replays(server: RunningServer, tmp_path: Path) -> None:
    store = server.plane.store
    first = submit(store, "a", "first", workers=2, gpus=8, user="alice")
    finish(server, first)
    second = submit(store, "b", "second", workers=1, gpus=4)
    finish(server, second)
    submit(store, "b", "waiting", workers=5, gpus=8)  # never fits: not exported
    out = tmp_path / "twin"
    runner = CliRunner()
    done = runner.invoke(
        app,
        [
            "twin",
            "export",
            "--out",
            str(out),
            "--url",
            server.url,
            "--token",
            server.tokens["admin"],
        ],
    )
    assert done.exit_code == 0, done.output
    assert done.output.startswith("2 jobs ->"), done.output
    rows = list(csv.DictReader((out / "trace.csv").open()))
    assert [(r["id"], r["tenant"], r["user"], r["num_gpus"], r["workers"]) for r in rows] == [
        (first, "a", "alice", "16", "2"),
        (second, "b", "test", "4", "1"),
    ]
    assert rows[0]["submit_time"] == "0" and rows[0]["outcome"] == "succeeded"
    # The live cost of preemption of the exported jobs: none preempted, each run admitted from
    # STARTING to its end.
    live_cost = json.loads((out / "preemption-cost.json").read_text())
    assert set(live_cost) == {"a", "b"} and live_cost["a"]["preemptions"] == 0
    starts = {e.at for e in store.events(first) if e.to_state == "STARTING"}
    (ended,) = [e.at for e in store.events(first) if e.to_state == "SUCCEEDED"]
    assert live_cost["a"]["admitted_gpu_hours"] == pytest.approx(16 * (ended - min(starts)) / 3600)
    files = [f"--{name}" for name in ("trace", "cluster", "config")]
    paths = [str(out / name) for name in ("trace.csv", "cluster.yaml", "config.yaml")]
    options = [item for pair in zip(files, paths, strict=True) for item in pair]
    sim_out = tmp_path / "sim"
    replayed = runner.invoke(
        app, ["sim", *options, "--no-failures", "--out", str(sim_out), "--no-report", "-o", "json"]
    )
    assert replayed.exit_code == 0, replayed.output
    (run,) = json.loads((sim_out / "summary.json").read_text())["runs"]
    assert run["completed"] == 2 and run["gpus"] == 32
    assert set(run["preemption_cost"]) == {"a", "b"} and run["preemptions_by_kind"] == {}
    costs = list(csv.DictReader((sim_out / "preemption-cost.csv").open()))
    assert [(r["tenant"], r["preemptions"]) for r in costs] == [("a", "0"), ("b", "0")]


def test_a_malformed_window_is_a_4xx_and_a_non_admin_is_refused(server: RunningServer) -> None:
    with server.client("admin") as admin:
        for query in ("since=abc", "since=5&until=1", "since=nan", "until=-1", "since=1e12"):
            response = admin.get(f"/v1/twin/export?{query}")
            assert response.status_code == 422, (query, response.text)
            assert response.json()["error"]
        assert admin.get("/v1/twin/export?since=0&until=1").json()["jobs"] == 0
    with server.client("alice") as alice:  # an admin of tenant a only
        assert alice.get("/v1/twin/export").status_code == 403
    runner = CliRunner()
    base = ["twin", "export", "--out", "unused", "--url", server.url]
    refused = runner.invoke(app, [*base, "--token", server.tokens["alice"]])
    assert refused.exit_code != 0 and refused.output.startswith("error:"), refused.output
    assert "Traceback" not in refused.output
    bad = runner.invoke(app, [*base, "--token", server.tokens["admin"], "--since", "yesterday"])
    assert bad.exit_code == 2 and "--since 'yesterday'" in bad.output, bad.output
