"""The operator and job commands of the CLI against a real server over a live control loop:
tenants, users, tokens, nodes, submit, jobs, queue, cancel, logs and status — each through its
``--url``/``--token`` options, with readable errors (no traceback) for a bad token or server."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from apiserver import serve
from liveplane import leading, open_live_plane, racks, users, wait_for
from typer.testing import CliRunner, Result

from aicluster.cli.main import app
from aicluster.core import JobState, Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

SPEC = """\
name: cli-job
tenant: a
entrypoint: train.py
workers: 2
resources: {gpus: 4}
"""

Cli = Callable[..., Result]


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[tuple[Cli, dict[str, str], object]]:
    plane = open_live_plane(tmp_path, [Tenant("a", quota={"H100": 16})], racks(1, 1, 2))
    tokens = users(plane.store, {"alice": ("a", Role.MEMBER)})
    runner = CliRunner()
    with leading(plane), serve(plane) as url:

        def run(*args: str, who: str = "admin", ok: bool = True) -> Result:
            result = runner.invoke(app, [*args, "--url", url, "--token", tokens[who]])
            assert (result.exit_code == 0) is ok, result.output
            assert result.exception is None or isinstance(result.exception, SystemExit)
            return result

        yield run, tokens, plane
    plane.store.close()


def test_tenants_users_and_tokens(cli: tuple[Cli, dict[str, str], object]) -> None:
    run, tokens, _ = cli
    run("tenants", "set", "b", "--quota", "H100=8", "--weight", "2")
    listed = run("tenants", "list").output
    assert re.search(r"\bb\b.*H100=8", listed), listed
    created = run("users", "create", "carol", "--tenant", "b", "--role", "member").output
    carol = created.strip().splitlines()[-1]
    tokens["carol"] = carol
    assert run("jobs", who="carol").output.strip() == "no jobs"  # a's jobs are not b's
    issued = run("tokens", "create", "--description", "ci", who="alice").output.strip()
    tokens["alice-2"] = issued
    mine = run("tokens", "list", who="alice-2").output
    token_id = next(line.split()[1] for line in mine.splitlines() if "ci" in line)
    assert run("tokens", "revoke", token_id, who="alice").output.strip().endswith("revoked")
    refused = run("jobs", who="alice-2", ok=False)
    assert refused.output.startswith("error:") and "Traceback" not in refused.output


def test_submit_list_queue_cancel_logs_status(
    cli: tuple[Cli, dict[str, str], object], tmp_path: Path
) -> None:
    run, _, plane = cli
    spec = tmp_path / "project" / "job.yaml"  # submit ships the spec's folder
    spec.parent.mkdir()
    spec.write_text(SPEC)
    (spec.parent / "train.py").write_text("print('train')\n")
    submitted = run("submit", str(spec), who="alice").output
    job_id = re.search(r"submitted (\S+)", submitted).group(1)  # type: ignore[union-attr]
    store = plane.store  # type: ignore[attr-defined]
    wait_for(lambda: store.get_job(None, job_id).state is not JobState.PENDING, "admission")
    assert job_id in run("jobs", who="alice").output
    assert "queue is empty" in run("queue", who="alice").output
    assert run("cancel", job_id, who="alice").output.startswith(job_id)
    wait_for(lambda: store.get_job(None, job_id).state is JobState.CANCELLED, "cancel")
    assert run("logs", job_id, who="alice").exit_code == 0
    status = run("status").output
    assert "nodes healthy" in status and "H100" in status


def test_nodes_cordon_uncordon_drain(cli: tuple[Cli, dict[str, str], object]) -> None:
    run, _, _ = cli
    assert "node-0-0-0" in run("nodes").output
    run("nodes", "cordon", "node-0-0-0", "--reason", "bad DIMM")
    assert "bad DIMM" in run("nodes").output
    run("nodes", "uncordon", "node-0-0-0")
    run("nodes", "drain", "node-0-0-1")
    assert "drain" in run("nodes").output.lower()
    denied = run("nodes", "cordon", "node-0-0-0", who="alice", ok=False)  # members may not
    assert denied.output.startswith("error:")
