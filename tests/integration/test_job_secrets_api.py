"""A job's secrets through a real API server and store (SQLite and PostgreSQL): submitted with
the real CLI, they are stored sealed (asserted on the raw rows and, on SQLite, on every byte of
the state directory) and shown back by no route, no CLI command and no event; another tenant
sees nothing of the job, and a sealed value copied into another tenant's spec opens to nothing
of the first tenant's."""

from __future__ import annotations

import json
import re
import secrets
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apiserver import RunningServer, serve_tenants
from sqlalchemy import text
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import Node, Tenant
from aicluster.core.jobspec import REDACTED, SEALED_PREFIX
from aicluster.runtime.sandbox.secretbox import SecretBox
from aicluster.store import Role

pytestmark = pytest.mark.integration

VALUE = "hunter2-" + secrets.token_hex(12)
OTHER_VALUE = "second-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve_tenants(
        module_store_url,
        tmp_path_factory.mktemp("state"),
        [Tenant(name, quota={"H100": 8}) for name in ("a", "b")],
        {"alice": ("a", Role.MEMBER), "bob": ("b", Role.MEMBER)},
        [Node("node-0", 8, "H100", "rack-0", "pod-0")],
    ) as running:
        yield running


def cli(server: RunningServer, who: str, *args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--url", server.url, "--token", server.tokens[who]])
    assert result.exit_code == 0, result.output
    return result.output


def submit_with_cli(server: RunningServer, tmp_path: Path) -> str:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    (project / "job.yaml").write_text(
        "name: with-secrets\ntenant: a\nentrypoint: train.py\nresources: {gpus: 1}\n"
        f'env: {{MODE: fast}}\nsecrets:\n  API_TOKEN: "{VALUE}"\n  SECOND: "{OTHER_VALUE}"\n'
    )
    out = cli(server, "alice", "submit", str(project / "job.yaml"))
    assert VALUE not in out and "holds secrets: not shipped with the code" in " ".join(out.split())
    return re.search(r"submitted (\S+)", out).group(1)  # type: ignore[union-attr]


def raw_rows(server: RunningServer) -> str:
    """Every row of the jobs and events tables, as the database returns them."""
    with server.plane.store.engine.connect() as connection:
        jobs = connection.execute(text("SELECT * FROM jobs")).all()
        events = connection.execute(text("SELECT * FROM events")).all()
    return "\n".join(str(value) for row in [*jobs, *events] for value in row)  # repr truncates


def get_routes(server: RunningServer) -> list[str]:
    with server.client() as anonymous:
        schema = anonymous.get("/openapi.json").json()
    return [path for path, item in schema["paths"].items() if "get" in item]


def fill(path: str, job_id: str) -> str:
    values = {"job_id": job_id, "tenant": "a", "name": "a", "version": "1", "rollout_id": "1"}
    values |= {"token_id": "x", "sha256": "0" * 64, "report": "r", "file": "f.json"}
    return re.sub(r"{(\w+)}", lambda match: values[match.group(1)], path)


def test_secrets_are_stored_sealed_and_shown_back_nowhere(
    server: RunningServer, tmp_path: Path
) -> None:
    job_id = submit_with_cli(server, tmp_path)

    # The store holds sealed values only, each opening to the value for its tenant and name.
    rows = raw_rows(server)
    assert VALUE not in rows and OTHER_VALUE not in rows
    record = server.plane.store.get_job(None, job_id)
    sealed = record.spec.secret_values()
    assert all(value.startswith(SEALED_PREFIX) for value in sealed.values())
    assert all(value in rows for value in sealed.values())
    box = SecretBox(server.plane.settings.state_dir)
    assert box.open_all("a", sealed) == {"API_TOKEN": VALUE, "SECOND": OTHER_VALUE}
    if server.plane.store.dialect != "postgresql":  # every byte of the SQLite files
        for path in server.plane.settings.state_dir.rglob("*"):
            if path.is_file():
                assert VALUE.encode() not in path.read_bytes(), path
    # The spec file, which holds the values, was not shipped with the code.
    archives = list((server.plane.settings.state_dir / "artifacts" / "code" / "a").glob("*.tar.gz"))
    assert archives
    for archive in archives:
        with tarfile.open(archive) as tar:
            assert tar.getnames() == ["train.py"]

    # Every GET route of the API, as the job's member and as the cluster admin.
    seen = 0
    for who in ("alice", "admin"):
        with server.client(who) as client:
            for path in [*get_routes(server), "/ui/", "/ui/app.js"]:
                response = client.get(fill(path, job_id))
                assert VALUE not in response.text and OTHER_VALUE not in response.text, path
                seen += response.status_code == 200
            job = client.get(f"/v1/jobs/{job_id}").json()
            assert job["spec"]["secrets"] == {"API_TOKEN": REDACTED, "SECOND": REDACTED}
            assert job["spec"]["env"] == {"MODE": "fast"}
    assert seen > 20

    # The CLI's views.
    for command in (["jobs"], ["queue"], ["why", job_id], ["logs", job_id]):
        assert VALUE not in cli(server, "alice", *command)

    # Another tenant: nothing of the job.
    with server.client("bob") as bob:
        assert bob.get(f"/v1/jobs/{job_id}").status_code == 404
        assert bob.get(f"/v1/jobs/{job_id}/events").status_code == 404
        assert job_id not in bob.get("/v1/jobs").text


def test_a_retry_with_other_secret_values_returns_the_original_job(server: RunningServer) -> None:
    spec = {"name": "retry", "tenant": "a", "module": "t", "secrets": {"K": "first"}}
    headers = {"Idempotency-Key": "k-1"}
    with server.client("alice") as alice:
        first = alice.post("/v1/jobs", json=spec, headers=headers)
        spec["secrets"] = {"K": "second"}
        again = alice.post("/v1/jobs", json=spec, headers=headers)
    assert first.status_code == 201 and again.status_code == 201, (first.text, again.text)
    assert first.json()["id"] == again.json()["id"]
    record = server.plane.store.get_job(None, first.json()["id"])
    box = SecretBox(server.plane.settings.state_dir)
    assert box.open_all("a", record.spec.secret_values()) == {"K": "first"}


def test_a_sealed_value_copied_into_another_tenants_spec_opens_to_itself_only(
    server: RunningServer,
) -> None:
    (alices,) = [j for j in server.plane.store.list_jobs("a")[0] if j.name == "with-secrets"]
    stolen = alices.spec.secret_values()["API_TOKEN"]
    spec = {"name": "thief", "tenant": "b", "module": "t", "secrets": {"API_TOKEN": stolen}}
    with server.client("bob") as bob:
        created = bob.post("/v1/jobs", json=spec)
    assert created.status_code == 201, created.text
    assert stolen not in created.text
    record = server.plane.store.get_job(None, created.json()["id"])
    box = SecretBox(server.plane.settings.state_dir)
    # Sealed again for b: it opens to the token as text, never to alice's value.
    assert box.open_all("b", record.spec.secret_values()) == {"API_TOKEN": stolen}


def test_bad_secrets_are_a_4xx_that_does_not_echo_them(server: RunningServer) -> None:
    big = "y" * 5000
    cases: list[dict[str, Any]] = [
        {"secrets": {"A": big}},
        {"secrets": {"A": 12345}},
        {"secrets": {"bad name": "v"}},
        {"secrets": {"MODE": "v"}, "env": {"MODE": "x"}},
    ]
    with server.client("alice") as alice:
        for extra in cases:
            spec = {"name": "bad", "tenant": "a", "module": "t", **extra}
            response = alice.post(
                "/v1/jobs", content=json.dumps(spec), headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 422, response.text
            assert big not in response.text and "12345" not in response.text
