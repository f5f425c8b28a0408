"""``submit -q``, ``cancel`` on a finished job and ``jobs --state`` comma lists, run through
Typer's CliRunner at 80 columns against a fake API client (no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aicluster.cli import common
from aicluster.cli.client import ApiError
from aicluster.cli.main import app

RUNNER = CliRunner()


class FakeClient:
    """Answers the few calls these commands make; records the rest."""

    def __init__(self, jobs: dict[str, dict[str, Any]] | None = None) -> None:
        self.jobs = jobs or {}
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def get(self, path: str, **params: Any) -> Any:
        self.calls.append(("GET", path, params))
        if path == "/v1/jobs":
            return {"jobs": [], "next_cursor": None}
        job_id = path.rsplit("/", 1)[-1]
        if job_id not in self.jobs:
            raise ApiError(f"no job {job_id!r} (HTTP 404)")
        return self.jobs[job_id]

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        self.calls.append(("POST", path, {}))
        job = self.jobs[path.split("/")[3]]
        if job["state"] == "PENDING":
            job.update(state="CANCELLED", cancel_requested=True)
        else:
            job.update(cancel_requested=True)
        return job

    def has_code(self, tenant: str, sha256: str) -> bool:
        return True

    def submit(self, text: str, idempotency_key: str | None = None) -> Any:
        self.calls.append(("POST", "/v1/jobs", {}))
        return {"id": "j-0192a3b4c5d6e7f8a9b", "name": "train", "tenant": "a"}


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> FakeClient:
    fake = FakeClient()
    monkeypatch.setattr(common, "client_for", lambda *args: fake)
    return fake


def _run(*args: str) -> Any:
    return RUNNER.invoke(app, list(args), env={"COLUMNS": "80"})


def _job(job_id: str, state: str) -> dict[str, Any]:
    return {"id": job_id, "state": state, "cancel_requested": False}


@pytest.mark.parametrize("state", ["SUCCEEDED", "FAILED", "CANCELLED"])
def test_cancel_on_a_finished_job_says_so_and_exits_non_zero(
    client: FakeClient, state: str
) -> None:
    client.jobs["j-1"] = _job("j-1", state)
    result = _run("cancel", "j-1")
    assert result.exit_code == 1
    assert f"job j-1 already {state}; nothing to cancel" in result.output
    assert ("POST", "/v1/jobs/j-1/cancel", {}) not in client.calls


def test_cancel_says_stopping_only_while_the_job_stops(client: FakeClient) -> None:
    client.jobs.update({"j-1": _job("j-1", "RUNNING"), "j-2": _job("j-2", "PENDING")})
    running = _run("cancel", "j-1")
    assert (running.exit_code, running.output) == (0, "j-1: RUNNING (stopping)\n")
    pending = _run("cancel", "j-2")
    assert (pending.exit_code, pending.output) == (0, "j-2: CANCELLED\n")


def test_submit_quiet_prints_only_the_id(client: FakeClient, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: train\ntenant: a\nentrypoint: train.py\n")
    quiet = _run("submit", "-q", str(spec))
    assert (quiet.exit_code, quiet.output) == (0, "j-0192a3b4c5d6e7f8a9b\n")
    loud = _run("submit", str(spec))
    assert (
        loud.exit_code == 0 and "submitted j-0192a3b4c5d6e7f8a9b (train, tenant a)" in loud.output
    )


@pytest.mark.parametrize(
    ("flags", "states"),
    [
        (["--state", "FAILED,RUNNING"], ["FAILED", "RUNNING"]),
        (["--state", "failed", "--state", "RUNNING,pending"], ["FAILED", "RUNNING", "PENDING"]),
        (["--state", "FAILED, FAILED"], ["FAILED"]),
        ([], None),
    ],
)
def test_jobs_takes_comma_lists_and_repeated_states(
    client: FakeClient, flags: list[str], states: list[str] | None
) -> None:
    result = _run("jobs", *flags)
    assert result.exit_code == 0, result.output
    assert client.calls[-1] == ("GET", "/v1/jobs", {"tenant": None, "state": states, "limit": 50})


def test_an_unknown_state_names_the_allowed_ones(client: FakeClient) -> None:
    result = _run("jobs", "--state", "FAILED,DONE")
    assert result.exit_code == 2 and not client.calls
    assert "--state: unknown state 'DONE': give one of PENDING, STARTING, RUNNING" in " ".join(
        result.output.split()
    )


@pytest.mark.parametrize(
    ("entrypoint", "words"),
    [
        ("train.py", "entrypoint: train.py is not in the code shipped from"),
        ("pkg", "entrypoint: pkg is a folder of the code shipped from"),
        ("pkg/train.py/", "entrypoint: pkg/train.py/ is not in the code shipped from"),
    ],
)
def test_submit_refuses_an_entrypoint_that_is_no_file_of_the_folder(
    client: FakeClient, tmp_path: Path, entrypoint: str, words: str
) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("")
    (tmp_path / "run.py").write_text("")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: train\ntenant: a\nentrypoint: {entrypoint}\n")
    result = _run("submit", str(spec))
    text = " ".join(result.output.split())  # Rich wraps long lines
    assert result.exit_code == 1 and text.startswith("error: " + words), text
    # What the folder ships (the spec is a file of it), and what to check.
    assert "it holds 3 files: job.yaml, pkg/train.py, run.py" in text
    assert "excluded by .gitignore / .aiclusterignore" in text
    assert ("POST", "/v1/jobs", {}) not in client.calls  # nothing sent


def test_submit_of_a_module_ships_without_checking_it(client: FakeClient, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: train\ntenant: a\nmodule: some.installed.module\n")
    result = _run("submit", "-q", str(spec))
    assert result.exit_code == 0, result.output
    assert ("POST", "/v1/jobs", {}) in client.calls
