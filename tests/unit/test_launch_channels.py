"""Launch channels, attacked without Ray: the launcher (root here) hands a rank's launch only to a
listener of the tenant's uid, a channel's file is out of every other uid's reach, a squatter gets
nothing and is an alarm, and the alarm reaches the event log and the metrics.

Real processes of other uids (in the tenant sandbox, as a job runs), a real SQLite store."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from serverproc import SANDBOX_REQUIRED

from aicluster.control.loop.alarms import ALARM_EVENT, record_alarms
from aicluster.control.views.metrics import PlaneCollector
from aicluster.core import Tenant
from aicluster.runtime.alarms import alarm_dir
from aicluster.runtime.gang.command import RankCommand
from aicluster.runtime.gang.worker import RankWorker
from aicluster.runtime.sandbox.bwrap import SandboxSpec, bwrap_argv
from aicluster.runtime.warm.launchchannel import (
    Canary,
    Credentials,
    WrongPeer,
    bind_channel,
    channel_path,
    connect_channel,
)
from aicluster.runtime.warm.starter import channel_of, spawn_warm
from aicluster.store import Store
from warmprocs import OWN, start_zygote

# Runs processes as other uids, in sandboxes (root, bubblewrap): skipped locally without them,
# never under CI=true, where these tests run and fail.
pytestmark = SANDBOX_REQUIRED

TEAM_A = 300_901  # the attacker's uid (and gid)
TEAM_B = 300_902  # the victim's

# A squatter: listens on the inherited socket, takes one connection and says what reached it.
SQUATTER = """
import json, socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
listener.listen(1)
print("listening", flush=True)
listener.settimeout(20)
conn, _ = listener.accept()
conn.settimeout(5)
got, fds = b"", []
try:
    while True:
        data, more, _, _ = socket.recv_fds(conn, 1 << 16, 8)
        got, fds = got + data, fds + more
        if not data:
            break
except OSError:
    pass
print(json.dumps({"bytes": len(got), "fds": len(fds), "text": got.decode(errors="replace")}))
"""


def _as_uid(uid: int, code: str, *args: str, writable: tuple[str, ...] = ()) -> list[str]:
    """The command running Python ``code`` as ``uid`` in a tenant sandbox (as a job runs)."""
    spec = SandboxSpec(uid=uid, gid=uid, workdir="/", writable=writable)
    return bwrap_argv(spec, [sys.executable, "-c", code, *args])


def _squat(listener: socket.socket, uid: int) -> subprocess.Popen[str]:
    """A process of ``uid`` listening on ``listener`` (as if it had taken the channel)."""
    process = subprocess.Popen(
        _as_uid(uid, SQUATTER, str(listener.fileno())),
        pass_fds=(listener.fileno(),),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "listening"
    return process


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "db")
    opened.create_tenant(Tenant("team-b"), "test")
    yield opened
    opened.close()


def test_a_channels_file_is_out_of_reach_of_every_other_uid(tmp_path: Path) -> None:
    channel = channel_path(tmp_path / "warm", "aicluster-warm/node/team-b.0")
    with bind_channel(channel) as listener:
        listener.listen(1)
        assert (channel.parent.stat().st_mode & 0o777, channel.stat().st_mode & 0o777) == (
            0o700,
            0o600,
        )
        code = (  # the directory by a descriptor: a long pytest path still fits a socket address
            "import os, socket, sys\n"
            "folder, leaf = os.path.split(sys.argv[1])\n"
            "short = f'/proc/self/fd/{os.open(folder, os.O_PATH)}/'\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(short + leaf); print('CONNECTED')\n"
            "except OSError as e:\n    print(type(e).__name__)\n"
            "try:\n    open(short + 'x', 'w'); print('CREATED')\n"
            "except OSError as e:\n    print(type(e).__name__)\n"
        )
        # The warm directory as a job would see it, were it mounted into its sandbox.
        shown = (str(channel.parent.parent),)
        done = subprocess.run(
            _as_uid(TEAM_A, code, str(channel), writable=shown),
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.stdout.split() == ["PermissionError", "PermissionError"], done


def test_a_launcher_refuses_a_directory_it_does_not_own(tmp_path: Path) -> None:
    channel = channel_path(tmp_path / "warm", "x")
    channel.parent.mkdir(parents=True, mode=0o700)
    os.chown(channel.parent, TEAM_A, TEAM_A)  # made by someone else before the launcher
    with pytest.raises(PermissionError):
        connect_channel(channel, (TEAM_B, TEAM_B))
    with pytest.raises(PermissionError):
        bind_channel(channel)


def test_a_listener_of_another_uid_gets_nothing_and_raises_an_alarm(
    tmp_path: Path, store: Store
) -> None:
    """The launcher finds team-a's process on team-b's channel (as a squat would leave it):
    it sends nothing (no request, no log descriptors, no secrets), starts the rank cold and
    raises an alarm, which becomes an event of the tenant and a count in the metrics."""
    state_dir = tmp_path / "state"
    channel = channel_of("node-1", state_dir, "team-b")
    listener = bind_channel(channel)
    squatter = _squat(listener, TEAM_A)
    listener.close()

    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "job.py").write_text("print('team-b at work')\n")
    secret = "secret-" + secrets.token_hex(16)
    command = RankCommand(
        entrypoint="job.py",
        module=None,
        args=[],
        env={"PATH": os.environ["PATH"], "TEAM_B_SECRET": secret},
        workdir=str(workdir),
        stdout=tmp_path / "out.log",
        stderr=tmp_path / "err.log",
        sandbox=SandboxSpec(uid=TEAM_B, gid=TEAM_B, workdir=str(workdir), writable=()),
        secret_names=frozenset({"TEAM_B_SECRET"}),
    )
    worker = RankWorker(str(state_dir), "j-victim", 1, 0)
    assert worker._try_warm(command, "node-1", {"tenant": "team-b"}) is None  # a cold start

    out, _ = squatter.communicate(timeout=30)
    assert json.loads(out) == {"bytes": 0, "fds": 0, "text": ""}
    assert secret not in out
    [alarm_file] = alarm_dir(state_dir).iterdir()
    alarm = json.loads(alarm_file.read_text())
    assert alarm["alarm"] == "launch_channel.wrong_peer" and alarm["tenant"] == "team-b"
    assert (alarm["peer_uid"], alarm["expected_uid"]) == (TEAM_A, TEAM_B)
    assert alarm_file.stat().st_mode & 0o777 == 0o600

    assert record_alarms(store, state_dir) == 1
    assert not list(alarm_dir(state_dir).iterdir())  # taken once
    [event] = store.events_of_kind((ALARM_EVENT,))
    assert event.tenant == "team-b" and event.details["job_id"] == "j-victim"
    families = {f.name: f for f in PlaneCollector(SimpleNamespace(store=store))._events()}
    [sample] = families["aicluster_security_alarms"].samples
    assert sample.labels == {"tenant": "team-b", "alarm": "launch_channel.wrong_peer"}
    assert sample.value == 1


def test_spawn_warm_checks_the_peer_before_it_opens_or_sends_anything(tmp_path: Path) -> None:
    channel = channel_path(tmp_path / "warm", "y")
    listener = bind_channel(channel)
    squatter = _squat(listener, TEAM_A)
    listener.close()
    stdout = tmp_path / "never-opened.log"
    with pytest.raises(WrongPeer) as raised:
        spawn_warm(channel, (TEAM_B, TEAM_B), ["x.py"], {"K": "v"}, ".", stdout, stdout)
    assert raised.value.found.uid == TEAM_A and not stdout.exists()
    out, _ = squatter.communicate(timeout=30)
    assert json.loads(out)["bytes"] == 0


def test_the_real_warm_process_passes_the_check(tmp_path: Path) -> None:
    channel, process = start_zygote(tmp_path, "")
    try:
        connect_channel(channel, OWN).close()
        with pytest.raises(WrongPeer):
            connect_channel(channel, (TEAM_B, TEAM_B))
    finally:
        process.kill()
        process.wait()


def test_the_retired_abstract_name_is_a_tripwire() -> None:
    name = f"aicluster-warm-test/{secrets.token_hex(6)}/team-b.00"
    seen: list[tuple[str, dict[str, object]]] = []
    canary = Canary(name, lambda what, details: seen.append((what, details)))
    assert canary.arm()
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect({chr(0) + name!r})"
    subprocess.run(_as_uid(TEAM_A, connect), check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen and seen[0][0] == "probed" and seen[0][1]["uid"] == TEAM_A

    # Held by someone else first (a squat before the tenant's first job): an alarm, once armed.
    other = f"aicluster-warm-test/{secrets.token_hex(6)}/team-b.00"
    with socket.socket(socket.AF_UNIX) as squat:
        squat.bind("\0" + other)
        late: list[str] = []
        assert not Canary(other, lambda what, _: late.append(what)).arm()
    assert late == ["squatted"]


def test_a_probe_in_a_loop_raises_one_alarm_a_minute_per_uid() -> None:
    """A job that connects to a tripwire in a loop must not flood the event log."""
    now = [0.0]
    seen: list[dict[str, object]] = []
    canary = Canary("never-bound", lambda _, details: seen.append(details), lambda: now[0])
    for _ in range(5):
        canary.probed(Credentials(pid=7, uid=TEAM_A, gid=TEAM_A))
    canary.probed(Credentials(pid=8, uid=TEAM_B, gid=TEAM_B))
    assert [(d["uid"], d["repeated"]) for d in seen] == [(TEAM_A, 0), (TEAM_B, 0)]
    now[0] = 61.0
    canary.probed(Credentials(pid=7, uid=TEAM_A, gid=TEAM_A))
    assert (seen[-1]["uid"], seen[-1]["repeated"]) == (TEAM_A, 4)
