"""The tenant sandbox, attacked: a member of team-a submits from its own folder, with the real CLI,
a job that does its work and then tries every way out while team-b's job runs on the same host.

One sandboxed control-plane server on the session's Ray cluster (token authentication on).
Each denial is an assertion; the job itself still SUCCEEDS.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverproc import (
    SANDBOX_REQUIRED,
    ServerProcess,
    admin_token,
    processes_running,
    sandboxed_server,
)

from aicluster.runtime import RunDir
from aicluster.runtime.cluster.rayauth import TOKEN_PATH
from aicluster.runtime.warm.starter import channel_of, log_dir, socket_name

# Where bubblewrap cannot run, these skip locally and FAIL under CI=true (SANDBOX_REQUIRED).
pytestmark = [pytest.mark.integration, SANDBOX_REQUIRED]

JOB_FOLDER = Path(__file__).parent / "sandbox_job"
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
DISK_GB = 0.05  # each job's data directory: far more than the other jobs here write
REPO = Path(__file__).resolve().parents[2]
TENANTS = {
    "team-a": {"quota": {"sim-gpu": 8}},
    "team-b": {"quota": {"sim-gpu": 8}},
    "team-c": {"quota": {"sim-gpu": 8}},  # its first job is squatted for (never launched before)
}
# What a job may find in its environment (docs/runtime.md), besides its spec's env:.
DOCUMENTED = {
    "PATH", "HOME", "PWD", "USER", "LOGNAME", "TMPDIR", "LANG", "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME",
}  # fmt: skip


@pytest.fixture(scope="module")
def sandboxed(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    work = tmp_path_factory.mktemp("sandboxed")
    disk = ("--job-disk-gb", str(DISK_GB))
    with sandboxed_server("sandboxed", ray_cluster.address, work, TENANTS, disk) as server:
        yield server, ray_cluster


def submit(server: ServerProcess, token: str, folder: Path, spec: str) -> str:
    return server.submit(token, folder / spec)


def test_a_hostile_job_does_its_work_and_reaches_nothing_else(
    sandboxed: Any, tmp_path: Path
) -> None:
    server, ray_cluster = sandboxed
    state_dir = server.state_dir
    alice, bob = server.create_member("alice", "team-a"), server.create_member("bob", "team-b")

    victim_id = submit(server, bob, JOB_FOLDER, "victim.yaml")
    server.wait_for(lambda: server.job(victim_id)["state"] == "RUNNING", 120, "the victim to run")
    victim_data = os.path.realpath(RunDir(state_dir, victim_id, 1).data_link)
    server.wait_for(
        lambda: Path(victim_data, "1", "victim-secret.txt").exists(), 60, "victim's file"
    )
    # Only now, with the victim at work: a cold start is a launcher, then bwrap, then Python.
    victim_pids = processes_running("victim.py")

    project = tmp_path / "project"  # alice's own folder, with what the probe should try
    shutil.copytree(JOB_FOLDER, project)
    targets = {
        "admin_token": str(state_dir / "admin.token"),
        "ray_token": os.environ[TOKEN_PATH],
        "database": str(state_dir / "aicluster.db"),
        "state_dir": str(state_dir),
        "other_data": victim_data,
        "other_file": os.path.join(victim_data, "1", "victim-secret.txt"),
        "other_log": str(RunDir(state_dir, victim_id, 1).log_file(0)),
        "gcs_address": ray_cluster.address,
        "ray_client": "ray://127.0.0.1:10001",
        "other_pids": sorted(victim_pids),
        "launcher_dir": str(REPO),  # the server's (and so Ray's driver's) working directory
        "other_job": victim_id,
        "forbidden_writes": [
            "/hostile.txt",
            "/usr/hostile.txt",
            "/etc/hostile.txt",
            str(state_dir / "hostile.txt"),
            os.path.join(victim_data, "hostile.txt"),
            os.path.join(sys.prefix, "hostile.txt"),
            str(REPO / "src" / "hostile.txt"),
        ],
    }
    (project / "targets.json").write_text(json.dumps(targets))
    spec = (project / "job.yaml").read_text() + 'args: ["--targets", "targets.json"]\n'
    (project / "job.yaml").write_text(spec)

    probe_id = submit(server, alice, project, "job.yaml")
    server.wait_for(lambda: server.job(probe_id)["state"] in ("SUCCEEDED", "FAILED"), 300, "probe")
    record = server.job(probe_id)
    run = RunDir(state_dir, probe_id, 1)
    log = run.read_log(0).text
    assert record["state"] == "SUCCEEDED", (record, log, run.read_log(0, "stderr").text)
    assert "RESULT 42" in log  # its own module, from its own folder
    result = Path(os.path.realpath(run.job_run_dir)) / "result.txt"
    assert result.read_text() == "42\n"
    probes = json.loads(log.split("PROBES ", 1)[1].splitlines()[0])

    uid = int(probes["uid"])
    assert uid != 0 and uid != os.getuid() and result.stat().st_uid == uid
    assert uid not in victim_pids.values()  # another tenant, another uid
    denied = [
        "read admin token",
        "read ray token",
        "open database",
        "list other tenant's data",
        "read other tenant's file",
        "read other tenant's log",
        "list Ray's session",
        "read launcher's files",
        "ray.init auto",
        "ray.init gcs",
        "ray client",
        *(f"see pid {pid}" for pid in victim_pids),
        *(f"signal pid {pid}" for pid in victim_pids),
        *(f"write {path}" for path in targets["forbidden_writes"]),
    ]
    for name in denied:
        assert probes[name].startswith("denied"), (name, probes[name])
    for name in [key for key in probes if key.startswith("allowed write")]:
        assert probes[name].startswith("ALLOWED"), (name, probes[name])
    assert max(json.loads(probes["processes seen"])) < 50  # its own PID namespace only
    # Ray's metrics export listed every actor, the victim's ranks (named by its job id) too,
    # and the autoscaler monitor's answered without a token: both are off. Of this cluster's
    # processes only the dashboard's metrics (no job in them: docs/runtime.md) answer a job.
    answered = {
        int(port): named for port, named in json.loads(probes["metrics without a token"]).items()
    }
    assert not [port for port, named in answered.items() if named], answered
    session = ray_cluster._ray.head_node.get_session_dir_path()
    ours = ray_listeners(session)
    assert {ours[port] for port in answered if port in ours} <= {"dashboard.py"}, (answered, ours)
    monitor = "autoscaler/_private/monitor.py"
    assert not [cmd for cmd in command_lines().values() if monitor in cmd and session in cmd]
    # Of the launcher's working directory (a checkout) only the ways down to the interpreter's
    # environment and aicluster's package are there, and no file.
    seen = json.loads(probes["list launcher's directory"])
    assert all((REPO / name).is_dir() for name in seen), seen
    assert not {"README.md", "pyproject.toml", "tests", ".git"} & set(seen), seen
    # The control plane's state is its own: the directory 0700, its files 0600.
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    written = ["admin.token", "server.json", "aicluster.db", "aicluster.db-wal", "aicluster.db-shm"]
    modes = {name: stat.S_IMODE((state_dir / name).stat().st_mode) for name in written}
    assert modes == dict.fromkeys(written, 0o600), modes
    # The state directory shows only the way down to the job's own data directory.
    assert probes["list state dir"] in ("ALLOWED: ['tenants']", "denied"), probes["list state dir"]

    environment = json.loads(probes["environment"])
    secrets = [admin_token(state_dir), Path(os.environ[TOKEN_PATH]).read_text().strip()]
    assert not [key for key, value in environment.items() if any(s in value for s in secrets)]
    assert not [key for key in environment if key.startswith("RAY")]
    unknown = set(environment) - DOCUMENTED
    assert all(key.startswith("AICLUSTER_") for key in unknown), unknown
    assert "AICLUSTER_TOKEN" not in environment and "AICLUSTER_URL" not in environment
    shipped = json.loads(probes["files shipped"])
    assert "helper_mod.py" in shipped and "notes-not-shipped.txt" not in shipped

    # The neighbour was untouched: still running, still team-b's
    victim = server.job(victim_id)
    assert victim["state"] == "RUNNING", victim
    # (Its record in the message: a second cold start here was a second launch of the victim.)
    assert processes_running("victim.py") == victim_pids, victim
    server.cli(bob, "cancel", victim_id)
    server.wait_for(lambda: server.job(victim_id)["state"] == "CANCELLED", 60, "the cancel")


def test_a_squatter_of_another_tenants_launch_channels_gets_nothing_and_is_an_alarm(
    sandboxed: Any, tmp_path: Path
) -> None:
    """The attack of the tenant-network issue, replayed: a team-a job takes every launch-channel
    name it can derive for team-c on every node, and tries team-c's channel files, while
    team-c's first job, with a secret, starts. Nothing of team-c's reaches it, team-c's job
    SUCCEEDS, and the squat is an alarm in the events and the metrics."""
    import ray

    server, _ = sandboxed
    state_dir = server.state_dir
    mallory = server.create_member("mallory", "team-a")
    cara = server.create_member("cara", "team-c")
    admin = admin_token(state_dir)
    project = tmp_path / "squatter"
    shutil.copytree(JOB_FOLDER, project)
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    channels = [str(channel_of(node, state_dir, "team-c")) for node in nodes]
    (project / "targets.json").write_text(json.dumps(channels))
    spec = project / "squatter.yaml"
    spec.write_text(spec.read_text() + 'args: ["team-c"]\n')
    squatter = submit(server, mallory, project, "squatter.yaml")
    squatter_run = RunDir(state_dir, squatter, 1)
    ours = socket_name("node", "team-c", log_dir(state_dir)).split("/")[-1]

    def squatting_here() -> bool:  # this server's team-c names held on every node (other
        # servers of the session leave names of their own scope that it takes too)
        log = squatter_run.read_log(0).text if squatter_run.log_file(0).exists() else ""
        held = [line for line in log.splitlines() if line.startswith("HELD ")]
        return len([line for line in held if line.endswith(ours)]) >= len(nodes)

    server.wait_for(squatting_here, 180, "the squatter to hold team-c's names")

    secret = "team-c-secret-" + secrets.token_hex(16)
    victim_spec = project / "victim-c.yaml"
    victim_spec.write_text(
        json.dumps(
            {
                "name": "channel-victim",
                "tenant": "team-c",
                "entrypoint": "channel_victim.py",
                "workers": 1,
                "resources": {"gpus": 1, "cpus": 1, "memory_gb": 1, "gpu_type": "sim-gpu"},
                "max_restarts": 0,
                "secrets": {"API_TOKEN": secret},
            }
        )
    )
    victim = submit(server, cara, project, "victim-c.yaml")
    server.wait_for(lambda: server.job(victim)["state"] in ENDED, 180, "team-c's job to end")
    victim_log = RunDir(state_dir, victim, 1).read_log(0).text
    assert server.job(victim)["state"] == "SUCCEEDED", (server.job(victim), victim_log)
    assert f"secret sha {hashlib.sha256(secret.encode()).hexdigest()}" in victim_log
    assert "team-a" not in victim_log

    # team-c's warm processes start meanwhile (prewarm): give every node the chance to hand
    # a launch to the squatter before it lets go.
    time.sleep(5)
    Path(os.path.realpath(squatter_run.job_run_dir), "release").write_text("")
    server.wait_for(lambda: server.job(squatter)["state"] in ENDED, 120, "the squatter to end")
    log = squatter_run.read_log(0).text
    assert server.job(squatter)["state"] == "SUCCEEDED", (server.job(squatter), log)
    report = json.loads(log.split("REPORT ", 1)[1].splitlines()[0])
    assert len([name for name in report["held"] if name.endswith(ours)]) >= len(nodes), report
    assert report["received"] == [], report["received"]  # no request, descriptor or secret
    assert secret not in log
    for path in channels:  # team-c's channel files: not even visible
        denied = ["connect denied FileNotFoundError", "bind denied FileNotFoundError"]
        assert report["paths"][path] == denied, report["paths"][path]

    def alarms() -> list[dict[str, Any]]:
        with server.client(admin) as client:
            query = {"action": "security.alarm", "tenant": "team-c", "limit": 100}
            return list(client.get("/v1/audit", params=query).json()["items"])

    server.wait_for(lambda: bool(alarms()), 60, "the squat's alarm")
    kinds = {item["details"]["alarm"] for item in alarms()}
    assert "launch_channel.squatted" in kinds, alarms()
    with server.client(admin) as client:
        metrics = client.get("/metrics").text
    assert 'aicluster_security_alarms_total{alarm="launch_channel.squatted",tenant="team-c"}' in (
        metrics
    ), [line for line in metrics.splitlines() if "security" in line]


def test_a_tenants_ranks_fork_from_its_own_sandboxed_warm_process(
    sandboxed: Any, tmp_path: Path
) -> None:
    server, _ = sandboxed
    erin = server.create_member("erin", "team-a")
    project = tmp_path / "whoami"
    shutil.copytree(JOB_FOLDER, project)
    token = server.state_dir / "admin.token"
    spec = project / "whoami.yaml"
    spec.write_text(spec.read_text() + f'args: ["{token}"]\n')
    log, record = "", {}
    deadline = time.monotonic() + 240
    # The first job of the tenant on a node asks for the tenant's warm process there, which then
    # imports torch; jobs land on any of the 4 nodes.
    while not record.get("warm") and time.monotonic() < deadline:
        job = submit(server, erin, project, "whoami.yaml")
        server.wait_for(lambda j=job: server.job(j)["state"] == "SUCCEEDED", 120, "whoami")
        record = RunDir(server.state_dir, job, 1).exit_record(0) or {}
        log = RunDir(server.state_dir, job, 1).read_log(0).text
        time.sleep(2)
    assert record.get("warm") and "warm 1" in log, (record, log)
    uid = int(log.split("uid ", 1)[1].split()[0])
    assert uid != 0 and f"read {token}: denied" in log
    # team-a's warm processes of this server (other servers' tests may leave their own team-a's)
    this_servers = socket_name("node", "team-a", log_dir(server.state_dir)).split("/")[-1]
    tenant_zygotes = [
        uid_of
        for pid, uid_of in processes_running("_zygote.py").items()
        if len(_argv(pid)) > 5  # python _zygote.py FD PRELOAD LAUNCHER_UID NAME
        and _argv(pid)[1].endswith("_zygote.py")
        and _argv(pid)[5].endswith(this_servers)
    ]
    assert tenant_zygotes and set(tenant_zygotes) == {uid}  # the tenant's, never root's


def _argv(pid: int) -> list[str]:
    """A process's command line (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


PROBE_MODEL = """
import json
import os
import sqlite3
import subprocess
import sys

ARTIFACT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # code/ is inside it


def attempt(action):
    try:
        return "ALLOWED: " + repr(action())[:150]
    except Exception as error:
        return "denied: " + type(error).__name__


def write(path):
    with open(path, "w") as handle:
        handle.write("written by a hostile model")


def ray_connect(address):
    code = "import ray; ray.init(address=%r); print('CONNECTED')" % address
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=25)
    except subprocess.TimeoutExpired:
        raise TimeoutError("no connection within 25 s") from None
    if b"CONNECTED" in done.stdout:
        return "connected"
    raise ConnectionError("refused")


class Probe:
    def __init__(self, weights, config):
        self.targets = config["targets"]

    def predict(self, inputs):
        t = self.targets
        probes = {
            "uid": lambda: os.getuid(),
            "read admin token": lambda: open(t["admin_token"]).read(),
            "read ray token": lambda: open(t["ray_token"]).read(),
            "open database": lambda: sqlite3.connect("file:%s?mode=ro" % t["database"], uri=True)
            .execute("select count(*) from jobs").fetchall(),
            "list other tenant's data": lambda: os.listdir(t["other_data"]),
            "ray.init auto": lambda: ray_connect("auto"),
            "ray.init gcs": lambda: ray_connect(t["gcs_address"]),
            "write state dir": lambda: write(os.path.join(t["state_dir"], "hostile.txt")),
            "write its artifact": lambda: write(os.path.join(ARTIFACT, "hostile.txt")),
            "environment": lambda: json.dumps(dict(os.environ)),
        }
        name = inputs.get("probe")
        if name == "uid":
            return {"uid": os.getuid()}
        if name == "environment":
            return {"environment": dict(os.environ)}
        return {name: attempt(probes[name])}


def load(weights, config):
    return Probe(weights, config)
"""
MODEL_PROBES = [
    "read admin token",
    "read ray token",
    "open database",
    "list other tenant's data",
    "ray.init auto",
    "ray.init gcs",
    "write state dir",
    "write its artifact",
]


def test_a_served_models_code_reaches_nothing_else_either(sandboxed: Any, tmp_path: Path) -> None:
    import torch

    from aicluster.store import Store
    from aicluster.train.export import export_model

    server, ray_cluster = sandboxed
    gina, hank = server.create_member("gina", "team-a"), server.create_member("hank", "team-b")
    other = submit(server, hank, JOB_FOLDER, "neighbour.yaml")  # team-b's data, to look for
    server.wait_for(lambda: server.job(other)["state"] == "SUCCEEDED", 180, "team-b's job")
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe_model.py").write_text(PROBE_MODEL)
    store = Store.open(server.state_dir)
    try:
        targets = {
            "admin_token": str(server.state_dir / "admin.token"),
            "ray_token": os.environ[TOKEN_PATH],
            "database": str(server.state_dir / "aicluster.db"),
            "state_dir": str(server.state_dir),
            "other_data": os.path.realpath(RunDir(server.state_dir, other, 1).data_link),
            "gcs_address": ray_cluster.address,
        }
        export = export_model(
            torch.nn.Linear(1, 1),
            entrypoint="probe_model.py:load",
            config={"targets": targets},
            directory=tmp_path / "export",
            code_dir=code,
        )
        version = store.register_model_version(
            "team-a",
            "prober",
            source_dir=export,
            job_id=None,
            spec_hash=None,
            code_version="test",
            dataset_hash=None,
            metrics={},
            registered_by="gina",
        ).version
    finally:
        store.close()
    with server.client(gina) as client:
        deployed = client.post("/v1/deployments", json={"model": "prober", "version": version})
        assert deployed.status_code == 200, deployed.text

        def ask(probe: str) -> dict[str, Any]:
            answer = client.post("/v1/models/prober/predict", json={"probe": probe})
            assert answer.status_code == 200, answer.text
            return dict(answer.json()["outputs"])

        def serving() -> bool:
            answer = client.post("/v1/models/prober/predict", json={"probe": "uid"})
            return answer.status_code == 200

        server.wait_for(serving, 180, "the model to serve")
        uid = int(ask("uid")["uid"])
        assert uid != 0 and uid != os.getuid()
        for probe in MODEL_PROBES:
            assert ask(probe)[probe].startswith("denied"), (probe, ask(probe))
        environment = ask("environment")["environment"]
        # Undeployed: its replica would hold CPUs of the session's Ray cluster for later modules.
        assert client.delete("/v1/deployments/prober").status_code == 204
    secrets = [admin_token(server.state_dir), Path(os.environ[TOKEN_PATH]).read_text().strip()]
    assert not [key for key, value in environment.items() if any(s in value for s in secrets)]
    assert not [key for key in environment if key.startswith("RAY")]


def command_lines() -> dict[int, str]:
    """Every process's command line, by pid."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            found[int(pid)] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    return found


def ray_listeners(session_dir: str) -> dict[int, str]:
    """The TCP ports that this Ray cluster's processes listen on (those whose command line, or
    an ancestor's, names its session directory), each with the listener's program (its Python
    script's name, else its process title)."""
    commands = command_lines()

    def ours(pid: int) -> bool:
        for _ in range(4):  # the listener, its raylet, ...
            if session_dir in commands.get(pid, ""):
                return True
            with contextlib.suppress(OSError, IndexError, ValueError):
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return False

    found = {}
    listing = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True)
    for line in listing.stdout.splitlines():
        owner = re.search(r"pid=(\d+)", line)
        if owner is None or not ours(int(owner.group(1))):
            continue
        words = commands.get(int(owner.group(1)), "").split()
        scripts = [Path(word).name for word in words if word.endswith(".py")]
        found[int(line.split()[3].rsplit(":", 1)[1])] = (scripts or words or ["?"])[0]
    return found
