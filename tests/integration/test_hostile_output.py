"""Job output is untrusted input: a hostile tenant poisons everything the control plane reads of
its runs while another tenant's ordinary job is scheduled and SUCCEEDS in its usual time.

One sandboxed control-plane server on the session's Ray cluster. The poison (see
``hostile_job/poison.py``): telemetry with ``null``s, wrong types, non-objects, invalid UTF-8,
NaN, a line of 100,000 ``[`` and one of 8 MB; folders named with non-ASCII digits; forged exit
records and stop file; a FIFO where telemetry goes; a telemetry file deleted while it is read;
an export whose ``model.json`` is a FIFO or a link to the server's admin token. Then, as a job
running unsandboxed could, a log replaced by a link to the admin token: the API refuses it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import SANDBOX_REQUIRED, ServerProcess, admin_token, sandboxed_server

from aicluster.runtime import RunDir

pytestmark = [pytest.mark.integration, SANDBOX_REQUIRED]

JOB_FOLDER = Path(__file__).parent / "hostile_job"
TENANTS = {"team-evil": {"quota": {"sim-gpu": 8}}, "team-good": {"quota": {"sim-gpu": 8}}}
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("hostile")
    with sandboxed_server("hostile", ray_cluster.address, work, TENANTS) as running:
        yield running


def submit(server: ServerProcess, folder: Path, spec: str) -> str:
    return server.submit(admin_token(server.state_dir), folder / spec)


def get(server: ServerProcess, path: str) -> httpx.Response:
    with server.client(admin_token(server.state_dir), timeout_s=30) as client:
        return client.get(path)


def events(server: ServerProcess, job_id: str) -> list[dict[str, Any]]:
    return list(get(server, f"/v1/jobs/{job_id}/events").json())


def run_normal_job(server: ServerProcess) -> tuple[str, float]:
    """Submit team-good's ordinary job; its id and the seconds it took to SUCCEED."""
    started = time.monotonic()
    job_id = submit(server, JOB_FOLDER, "normal.yaml")
    server.wait_for(lambda: server.job(job_id)["state"] in TERMINAL, 180, "the normal job")
    assert server.job(job_id)["state"] == "SUCCEEDED", server.job(job_id)
    return job_id, time.monotonic() - started


def hostile_folder(tmp_path: Path, spec: str, mode: str, target: str) -> Path:
    folder = tmp_path / mode
    shutil.copytree(JOB_FOLDER, folder)
    text = (folder / spec).read_text() + f'args: ["{mode}", "{target}"]\n'
    (folder / spec).write_text(text)
    return folder


def test_poisoned_runs_never_stop_scheduling_for_others(
    server: ServerProcess, tmp_path: Path
) -> None:
    _, usual_s = run_normal_job(server)  # the usual time, on a quiet loop
    token_file = str(server.state_dir / "admin.token")

    poisoned = submit(server, hostile_folder(tmp_path, "telemetry.yaml", "telemetry", token_file),
                      "telemetry.yaml")  # fmt: skip
    fifo_export = submit(server, hostile_folder(tmp_path, "export.yaml", "export", token_file),
                         "export.yaml")  # fmt: skip
    link_export = submit(server, hostile_folder(tmp_path, "export.yaml", "export-link",
                                                token_file), "export.yaml")  # fmt: skip
    hostile = (poisoned, fifo_export, link_export)
    server.wait_for(
        lambda: "POISONED" in RunDir(server.state_dir, poisoned, 1).read_log(0).text,
        120,
        "the poison to be written",
    )

    normal_id, took_s = run_normal_job(server)  # while the poisoned runs are read
    assert took_s < usual_s * 3 + 30, (took_s, usual_s)

    server.wait_for(
        lambda: all(server.job(j)["state"] in TERMINAL for j in hostile),
        120,
        "the hostile jobs to end",
    )
    # The forged exit records and stop file were the job's own files, never read: rank 0
    # exited 3, so the job failed (max_restarts 0), not succeeded nor stopped.
    record = server.job(poisoned)
    assert record["state"] == "FAILED" and record["exit_code"] == 3, record
    rejected = [e for e in events(server, poisoned) if e["kind"] == "job.output_rejected"]
    assert rejected, events(server, poisoned)
    reasons = " ".join(str(e["details"]["reasons"]) for e in rejected)
    for why in ("not a JSON object", "invalid UTF-8", "time", "a line over"):
        assert why in reasons, reasons
    # The exports: the jobs succeeded, their models were not registered, nothing was read
    # through the FIFO or the link.
    for job_id in (fifo_export, link_export):
        assert server.job(job_id)["state"] == "SUCCEEDED"
        failed = [e for e in events(server, job_id) if e["kind"] == "model.register_failed"]
        assert failed, events(server, job_id)
        reason = failed[0]["details"]["reason"]
        assert "not a regular file" in reason or "link" in reason, reason
    assert get(server, "/v1/models").json() == []
    # No step of the loop failed on any of it.
    for job_id in (*hostile, normal_id):
        assert not [e for e in events(server, job_id) if e["kind"] == "job.handling_failed"]
    assert server.alive()

    # A log swapped for a link to a server file (as a job running unsandboxed could): refused.
    log_file = RunDir(server.state_dir, normal_id, 1).log_file(0)
    log_file.unlink()
    log_file.symlink_to(token_file)
    answer = get(server, f"/v1/jobs/{normal_id}/logs")
    assert answer.status_code == 409, answer.text
    assert admin_token(server.state_dir) not in answer.text
