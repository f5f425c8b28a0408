"""``aicluster why`` against a real server over a live control loop: the scheduler's reason for a
pending job, and the score breakdown of a placement."""

from __future__ import annotations

from pathlib import Path

import pytest
from apiserver import serve
from liveplane import leading, open_live_plane, racks, submit, users, wait_for
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration


def test_why_explains_a_wait_and_a_placement(tmp_path: Path) -> None:
    plane = open_live_plane(tmp_path, [Tenant("a", quota={"H100": 16})], racks(1, 1, 2))
    store = plane.store
    tokens = users(store, {"alice": ("a", Role.VIEWER)})
    with leading(plane), serve(plane) as url:
        placed = submit(store, "a", "fits", workers=2, gpus=4)
        waiting = submit(store, "a", "too-big", workers=4, gpus=8)
        wait_for(lambda: store.get_job(None, waiting).pending_reason is not None, "a reason")
        wait_for(lambda: store.get_job(None, placed).placement is not None, "a placement")
        runner = CliRunner()
        login = ["--url", url, "--token", tokens["alice"]]
        shown = runner.invoke(app, ["why", placed, *login])
        pending = runner.invoke(app, ["why", waiting, *login])
    store.close()
    assert shown.exit_code == 0, shown.output
    assert "placed in node" in shown.output
    for term in ("level", "nodes", "powered_nodes", "free_left_on_nodes"):
        assert f" {term} = " in shown.output
    assert "tighter best fit" in shown.output
    assert pending.exit_code == 0, pending.output
    assert "PENDING, position 1 in the queue" in pending.output
    assert store.get_job(None, waiting).pending_reason in " ".join(pending.output.split())
