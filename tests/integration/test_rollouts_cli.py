"""``aicluster rollout`` against a real API server and store (no Ray: the controller is not
running, so a started rollout stays at 0% until promoted or aborted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from apiserver import open_plane, serve
from stubmodels import register_stubs
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration


def test_start_status_promote_abort_and_errors(tmp_path: Path) -> None:
    plane = open_plane(tmp_path / "state")
    store = plane.store
    store.create_tenant(Tenant("a"), "test")
    store.create_user("alice", "test")
    store.grant_role("alice", "a", Role.MEMBER, "test")
    token = store.create_token("alice", "test").token
    register_stubs(store, "a", "gpt", tmp_path, 3)
    store.put_deployment("a", "gpt", {"replicas": 1}, {1: 100.0}, "alice")
    runner = CliRunner()
    with serve(plane) as url:
        login = ["--url", url, "--token", token]

        def run(*args: str) -> tuple[int, str]:
            result = runner.invoke(app, ["rollout", *args, *login])
            return result.exit_code, " ".join(result.output.split())

        code, out = run("gpt:2", "--steps", "10,50,100", "--interval", "2m",
                        "--max-error-rate", "0.5%", "--max-p99-ms", "250")  # fmt: skip
        assert code == 0, out
        assert "of v2 over v1: steps [10, 50, 100] every 120 s" in out
        assert "max error rate 0.5%, max p99 250 ms" in out
        code, out = run("gpt", "--status")
        assert code == 0 and "running, starting the new version" in out, out
        assert "started" in out
        code, out = run("gpt:3")
        assert code == 1 and "already has a rollout in progress (HTTP 409)" in out, out
        code, out = run("gpt", "--promote")
        assert code == 0 and "promoted (promoted by alice at 0%)" in out, out
        assert store.get_deployment("a", "gpt").traffic == {2: 100.0}
        assert run("gpt:3")[0] == 0
        code, out = run("gpt", "--abort")
        assert code == 0 and "aborted" in out, out
        assert store.get_deployment("a", "gpt").traffic == {2: 100.0}
        code, out = run("gpt", "--status")
        assert "aborted: aborted by alice at 0%" in out, out
        for args, message in (
            (("gpt:3", "--interval", "soon"), "not a duration"),
            (("gpt:3", "--max-error-rate", "5"), "fraction in [0, 1]"),
            (("gpt:3", "--steps", "50,10,100"), "steps must be strictly increasing (HTTP 422)"),
            (("gpt:9",), "no model 'gpt:9' (HTTP 404)"),
            (("nothing:2",), "no deployment 'nothing' (HTTP 404)"),
            (("gpt",), "give NAME:VERSION to start a rollout"),
            (("gpt:2", "--abort"), "takes the model NAME"),
            (("gpt", "--abort", "--promote"), "choose one of"),
            (("gpt:x",), "expected NAME or NAME:VERSION"),
        ):
            code, out = run(*args)
            assert code != 0 and message in out, (args, out)
            assert "Traceback" not in out
    store.close()
