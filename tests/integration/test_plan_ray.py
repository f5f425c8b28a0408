"""``aicluster plan --ray-address``: the replays run as tasks on a Ray cluster (the session's
embedded one: Ray's multiprocessing Pool, an actor per worker) and give the same answer as
replays in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_plan_cli import TEMPLATE, _window
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.runtime import EmbeddedCluster

pytestmark = pytest.mark.integration


def _plan(tmp_path: Path, name: str, *extra: str) -> dict[str, object]:
    trace, out = _window(tmp_path / "window.csv", count=150), tmp_path / name
    args = ["plan", "--trace", str(trace), "--cluster-template", TEMPLATE, "--out", str(out)]
    args += ["--slo", "p95_wait<=1h", "--vary", "nodes=2..24", *extra]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    answer: dict[str, object] = json.loads((out / "plan.json").read_text())["answers"][0]
    return answer


def test_the_replays_run_as_ray_tasks_with_the_same_answer(
    tmp_path: Path, ray_cluster: EmbeddedCluster
) -> None:
    before = _pool_actors()
    on_ray = _plan(tmp_path, "ray", "--workers", "2", "--ray-address", ray_cluster.address)
    assert len(_pool_actors() - before) == 2  # one per worker, ended with the plan
    here = _plan(tmp_path, "here", "--workers", "1")
    assert on_ray == here
    assert isinstance(here["nodes"], int) and here["below"] == here["nodes"] - 1


def _pool_actors() -> set[str]:
    """Ray's multiprocessing Pool actors, from the GCS's actor table (Ray's state API needs
    the dashboard, which the embedded cluster does not run)."""
    from ray._private.state import actors

    return {key for key, actor in actors().items() if actor["ActorClassName"].endswith("PoolActor")}
