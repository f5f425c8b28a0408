"""``aicluster models`` and ``aicluster model show|register`` against a real server and store."""

from __future__ import annotations

from pathlib import Path

import pytest
from apiserver import open_plane, serve
from liveplane import users
from modelkit import job_export_dir, succeeded_job, write_export
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration


def test_register_list_and_show_from_the_cli(tmp_path: Path) -> None:
    plane = open_plane(tmp_path / "state")
    store = plane.store
    store.create_tenant(Tenant("a"), "test")
    store.create_tenant(Tenant("b"), "test")
    tokens = users(store, {"alice": ("a", Role.MEMBER), "bob": ("b", Role.MEMBER)})
    job = succeeded_job(store, "a", name="tiny")
    write_export(job_export_dir(plane.settings.state_dir, job.id))
    runner = CliRunner()
    with serve(plane) as url:

        def cli(who: str, *args: str):  # type: ignore[no-untyped-def]
            login = ["--url", url, "--token", tokens[who]]
            return runner.invoke(app, [*args, *login], env={"COLUMNS": "200"})

        registered = cli("alice", "model", "register", job.id)
        listed = cli("alice", "models")
        versions = cli("alice", "model", "show", "tiny")
        lineage = cli("alice", "model", "show", "tiny:1")
        renamed = cli("alice", "model", "register", job.id, "--name", "other")
        hidden = cli("bob", "model", "show", "tiny:1")
        stolen = cli("bob", "model", "register", job.id, "--name", "mine")
        bad_ref = cli("alice", "model", "show", "tiny:x")
        bad_name = cli("alice", "model", "show", "../jobs")
        missing = cli("alice", "model", "show", "tiny:7")
    store.close()
    assert registered.exit_code == 0, registered.output
    assert f"registered tiny:1 (tenant a) from {job.id}" in registered.output
    assert listed.exit_code == 0 and "tiny" in listed.output and "loss 0.5" in listed.output
    assert versions.exit_code == 0 and "tiny:1" in versions.output and job.id in versions.output
    assert lineage.exit_code == 0, lineage.output
    for text in (job.id, job.spec_hash, "d" * 64, "linear.py:load", "by alice"):
        assert text in lineage.output
    assert renamed.exit_code == 0 and "other:1" in renamed.output
    for refused, code, message in (
        (hidden, 1, "no model 'tiny'"),
        (stolen, 1, f"no job '{job.id}'"),
        (bad_ref, 2, "expected NAME or NAME:VERSION"),
        (bad_name, 2, "is not a model name"),
        (missing, 1, "no model 'tiny:7'"),
    ):
        assert refused.exit_code == code, refused.output
        assert message in refused.output and "Traceback" not in refused.output
