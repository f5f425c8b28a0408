"""A job's secret, end to end on the session's Ray cluster with the tenant sandbox: it reaches the
job's process (started cold and forked warm) and its children, and nothing else. The job says so
by hash (``secret_job/secret_probe.py``); the test then looks for the value everywhere the
control plane could have let it out: every API response, the CLI's output, the events, the
dashboard, the server's log, every file of the state directory (database, run directories,
warm-process logs), Ray's session logs and the memory of the tenant's warm processes. Another
tenant's job, running beside it, finds the value in no process it can see.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serverproc import (
    SANDBOX_REQUIRED,
    ServerProcess,
    admin_token,
    processes_running,
    sandboxed_server,
)

from aicluster.runtime.sandbox.secretbox import KEY_FILE

pytestmark = [pytest.mark.integration, SANDBOX_REQUIRED]

JOB_FOLDER = Path(__file__).parent / "secret_job"
TENANTS = {"team-a": {"quota": {"sim-gpu": 8}}, "team-b": {"quota": {"sim-gpu": 8}}}
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("secrets")
    with sandboxed_server("secrets", ray_cluster.address, work, TENANTS) as running:
        yield running


def write_job(
    folder: Path, tenant: str, value: str | None, args: list[str], env: dict[str, str] | None = None
) -> Path:
    """A copy of ``secret_job/`` with a spec for ``tenant`` holding ``value`` as API_TOKEN."""
    shutil.copytree(JOB_FOLDER, folder)
    spec = {
        "name": "secret-probe",
        "tenant": tenant,
        "entrypoint": "secret_probe.py",
        "args": args,
        "workers": 1,
        "resources": {"gpus": 1, "cpus": 1, "memory_gb": 1, "gpu_type": "sim-gpu"},
        "max_restarts": 0,
        "env": env or {},
    }
    if value is not None:
        spec["secrets"] = {"API_TOKEN": value}
    (folder / "job.yaml").write_text(json.dumps(spec))  # JSON is YAML
    return folder / "job.yaml"


def output(server: ServerProcess, token: str, job_id: str) -> str:
    """The job's stdout, read as its member reads it: through the API, with the CLI."""
    return server.cli(token, "logs", job_id)


def wait_ended(server: ServerProcess, job_id: str, timeout_s: float = 180) -> dict[str, Any]:
    server.wait_for(lambda: server.job(job_id)["state"] in ENDED, timeout_s, f"{job_id} to end")
    return server.job(job_id)


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def files_holding(root: Path, needle: bytes, max_bytes: int = 64 << 20) -> list[str]:
    """Files under ``root`` (not following links) whose bytes contain ``needle``."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = Path(directory, name)
            try:
                if path.is_symlink() or not path.is_file() or path.stat().st_size > max_bytes:
                    continue
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether ``needle`` is in the readable memory of process ``pid`` (the test runs as root)."""
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
            regions = [line.split()[:2] for line in maps]
            for bounds, perms in regions:
                if not perms.startswith("r"):
                    continue
                start, end = (int(x, 16) for x in bounds.split("-"))
                try:
                    mem.seek(start)
                    if needle in mem.read(end - start):
                        return True
                except (OSError, OverflowError, ValueError):
                    continue
    except OSError:
        return False
    return False


def ray_session_dir() -> Path | None:
    try:
        import ray

        node = ray._private.worker.global_worker.node  # type: ignore[attr-defined]
        return Path(node.get_session_dir_path())
    except Exception:
        return None


def test_a_secret_reaches_its_jobs_processes_cold_and_warm_and_is_shown_back_nowhere(
    server: ServerProcess, tmp_path: Path
) -> None:
    alice = server.create_member("alice", "team-a")
    value = "s3cr3t-" + secrets.token_hex(16)
    key = str(server.state_dir / KEY_FILE)
    args = ["--name", "API_TOKEN", "--sha256", sha(value), "--read", key]

    # Cold: warm starts off for this job.
    cold_spec = write_job(tmp_path / "cold", "team-a", value, args, {"AICLUSTER_WARM_START": "0"})
    cold = server.submit(alice, cold_spec)
    record = wait_ended(server, cold)
    log = output(server, alice, cold)
    assert record["state"] == "SUCCEEDED", (record, log)
    assert "SECRET match" in log and "CHILD match" in log and "WARM 0" in log, log
    assert f"READ {key} denied" in log, log
    uid = int(log.split("UID ", 1)[1].split()[0])
    assert uid != 0 and uid != os.getuid()

    # Warm: until a job of the tenant lands on a node where its warm process is up.
    warm_spec = write_job(tmp_path / "warm", "team-a", value, args)
    warm_ids, log = [], ""
    deadline = time.monotonic() + 240
    while "WARM 1" not in log and time.monotonic() < deadline:
        warm_ids.append(server.submit(alice, warm_spec))
        record = wait_ended(server, warm_ids[-1])
        log = output(server, alice, warm_ids[-1])
        assert record["state"] == "SUCCEEDED", (record, log)
        assert "SECRET match" in log and "CHILD match" in log, log
        time.sleep(2)
    assert "WARM 1" in log, log

    # Shown back nowhere: the API (every job route, the dashboard's), the CLI, the events.
    everything = [cold, *warm_ids]
    texts: list[str] = []
    with server.client(alice) as client, server.client(admin_token(server.state_dir)) as admin:
        for viewer in (client, admin):
            for job_id in everything:
                for path in ("", "/events", "/why", "/logs", "/telemetry", "/goodput"):
                    texts.append(viewer.get(f"/v1/jobs/{job_id}{path}").text)
                texts.append(viewer.get(f"/v1/ui/jobs/{job_id}").text)
            for path in ("/v1/jobs", "/v1/queue", "/v1/ui/cluster-map", "/ui/", "/ui/app.js"):
                texts.append(viewer.get(path).text)
        texts.append(httpx.get(f"{server.url}/metrics", timeout=10).text)
    for command in (["jobs"], ["queue"], ["why", cold], ["logs", cold, "--stream", "stderr"]):
        texts.append(server.cli(alice, *command))
    leaked = [text[:200] for text in texts if value in text]
    assert leaked == []
    assert server.job(cold)["spec"]["secrets"] == {"API_TOKEN": "***"}

    # Nor on disk: the database, run directories (gang.json, logs, exit records), warm logs...
    assert files_holding(server.state_dir, value.encode()) == []
    assert value not in server.log_tail(10**9)  # the control plane's log
    session = ray_session_dir()  # ...Ray's logs (the actors' output, task events)
    assert session is not None and (session / "logs").is_dir(), session
    assert files_holding(session / "logs", value.encode()) == []
    # ...nor in the memory of the tenant's warm processes, which fork its every job.
    zygotes = [pid for pid, owner in processes_running("_zygote.py").items() if owner == uid]
    assert zygotes, "no warm process of the tenant found"
    assert not any(memory_holds(pid, value.encode()) for pid in zygotes)


def test_another_tenants_job_beside_it_finds_the_secret_nowhere(
    server: ServerProcess, tmp_path: Path
) -> None:
    carol, dave = server.create_member("carol", "team-a"), server.create_member("dave", "team-b")
    value = "s3cr3t-" + secrets.token_hex(16)
    args = ["--name", "API_TOKEN", "--sha256", sha(value)]
    holder = server.submit(
        carol, write_job(tmp_path / "a", "team-a", value, [*args, "--hold", "300"])
    )
    server.wait_for(lambda: "HOLDING" in output(server, carol, holder), 180, "the holder to run")
    assert "SECRET match" in output(server, carol, holder)

    key = str(server.state_dir / KEY_FILE)
    scan_args = [*args, "--scan", "--read", key]
    scanner = server.submit(dave, write_job(tmp_path / "b", "team-b", None, scan_args))
    record = wait_ended(server, scanner)
    log = output(server, dave, scanner)
    assert record["state"] == "SUCCEEDED", (record, log)
    assert server.job(holder)["state"] == "RUNNING"  # it ran beside the holder throughout
    assert "SECRET missing" in log and "CHILD missing" in log, log
    found = json.loads(log.split("SCAN ", 1)[1].splitlines()[0])
    assert found["readable"] > 0 and found["found"] == 0, found
    assert f"READ {key} denied" in log, log
    # Nor through the API: the holder does not exist for team-b.
    with server.client(dave) as client:
        assert client.get(f"/v1/jobs/{holder}").status_code == 404
        assert client.get(f"/v1/jobs/{holder}/logs").status_code == 404
        assert value not in client.get("/v1/jobs").text
    server.cli(carol, "cancel", holder)
    server.wait_for(lambda: server.job(holder)["state"] == "CANCELLED", 60, "the cancel")
