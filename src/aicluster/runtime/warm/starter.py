"""Warm starts: rank processes forked from a per-node process that has torch imported already.

Starting a rank's interpreter and importing torch takes seconds, more on a loaded machine, and a
restarted gang pays it on every rank at once. Each Ray node therefore keeps one *warm process*
(``_zygote.py``), held by a detached actor of its own (:class:`WarmStarter`, named
``aicluster-warm/<ray node id>``, no resources). A rank's actor asks it for the rank's process
over its launch channel (:func:`spawn_warm`, :mod:`.launchchannel`) and falls back to a cold
``python -u`` start when there is none yet (the first gang on a node starts it), when the rank's
environment changes what an interpreter reads at start-up (:func:`warm_compatible`), or when
``AICLUSTER_WARM_START=0``. Either way the rank has the same exit codes, signals, process group,
logs and lifetime (it dies with its actor and its node).

With the tenant sandbox (:mod:`aicluster.runtime.sandbox.bwrap`) each node keeps one warm process
per tenant instead (``aicluster-warm/<ray node id>/<tenant>.<state dir>``, see :func:`socket_name`),
itself started in that tenant's
sandbox as the tenant's uid, seeing the tenant's directory and nothing else: its forks are the
tenant's ranks, never a fork of a root process. It serves only the launcher's uid (root), which
hands it the rank's log files and cgroups as open descriptors (``SCM_RIGHTS``) and signals the rank
through it (the rank's pid is one of the sandbox's PID namespace). The launcher sends nothing
before it has checked that the listener is the tenant's uid (:mod:`.launchchannel`: the channel's
socket file is root's, bound by root, listened on by the warm process alone).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aicluster.runtime.alarms import raise_alarm
from aicluster.runtime.cluster.powermeter import PowerReporter
from aicluster.runtime.environment import base_env
from aicluster.runtime.sandbox.bwrap import CHILD_SHIM, SandboxSpec, bwrap_argv
from aicluster.runtime.warm.launchchannel import Canary, bind_channel, channel_path, connect_channel

__all__ = [
    "WARM_START",
    "WarmChild",
    "WarmStarter",
    "channel_of",
    "ensure_warm_starter",
    "log_dir",
    "socket_name",
    "spawn_warm",
    "tenant_warm_sandbox",
    "warm_compatible",
    "warm_env",
]

#: ``0`` (in the rank's environment or the node's) turns warm starts off.
WARM_START = "AICLUSTER_WARM_START"
#: Modules the warm process imports (comma-separated).
PRELOAD = os.environ.get(
    "AICLUSTER_WARM_PRELOAD",
    # torch._dynamo: what torch.use_deterministic_algorithms() imports (sympy and more: 1 s)
    "torch,torch.distributed,torch.nn.parallel,torch.distributed.checkpoint,torch._dynamo",
)
_ZYGOTE = str(Path(__file__).with_name("_zygote.py"))
# Read by an interpreter or a native library when it starts: a forked rank would keep the warm
# process's value. OMP_NUM_THREADS is the exception: the child applies it with set_num_threads.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS")


def log_dir(state_dir: str | os.PathLike[str]) -> str:
    """Where the warm processes of a runtime with ``state_dir`` write their logs."""
    return os.path.join(state_dir, "warm")


def scope_digest(scope: str) -> str:
    """The 8 hex digits that end a tenant's warm starter name for ``scope`` (a state
    directory's warm log directory, :func:`log_dir`): which runtime the starter serves."""
    import hashlib

    return hashlib.sha256(scope.encode(errors="surrogatepass")).hexdigest()[:8]


def socket_name(ray_node_id: str, tenant: str | None = None, scope: str = "") -> str:
    """The name of a Ray node's warm process (of ``tenant``'s sandbox when given): its actor's,
    its launch channel's (as a digest, :func:`channel_of`) and its retired abstract socket's (a
    tripwire now, :class:`~aicluster.runtime.warm.launchchannel.Canary`). A tenant's warm process
    mounts the tenant's directory of one state directory, so its name carries ``scope`` (that
    state directory's warm log directory) as well: ``<base>/<tenant>.<8 hex of scope>``, the
    tenant's name encoded injectively (:func:`aicluster.core.names.part`); where that would not
    fit an abstract socket address (107 bytes), ``<base>/~~<32 hex of SHA-256 of scope and
    tenant>``."""
    import hashlib

    from aicluster.core.names import SEPARATOR, part

    base = f"aicluster-warm/{ray_node_id}"
    if not tenant:
        return base
    scoped = f"{base}/{part(tenant)}{SEPARATOR}{scope_digest(scope)}"
    if len(scoped.encode()) <= 107:
        return scoped
    both = f"{scope}\0{tenant}".encode(errors="surrogatepass")
    digest = hashlib.sha256(both).hexdigest()[:32]
    return f"{base}/~~{digest}"


def channel_of(ray_node_id: str, state_dir: str | os.PathLike[str], tenant: str | None) -> Path:
    """The launch channel (socket file) of the warm process of ``tenant`` (None: the node's
    own) on a Ray node, for the runtime of ``state_dir``."""
    logs = log_dir(state_dir)
    return channel_path(logs, socket_name(ray_node_id, tenant, logs))


def tenant_warm_sandbox(
    state_dir: str | os.PathLike[str], tenant: str, user: tuple[int, int]
) -> SandboxSpec:
    """The sandbox of ``tenant``'s warm processes: the tenant's directory (every job's data of
    the tenant, and nothing else), as the tenant's uid."""
    from aicluster.runtime.rundir import tenant_dir

    root = os.path.realpath(tenant_dir(state_dir, tenant))
    return SandboxSpec(
        uid=user[0], gid=user[1], workdir=root, writable=(root,), hidden=(str(state_dir),)
    )


def warm_env() -> dict[str, str]:
    """The environment of a warm process (a rank's replaces it after the fork)."""
    return {**base_env(), "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def warm_compatible(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> bool:
    """Whether a process with environment ``env`` may be forked from a warm process started with
    ``base`` (default: :func:`warm_env`, what the node's warm processes are started with).
    ``AICLUSTER_WARM_START=0`` in ``env``, ``base`` or the node's environment says no."""
    base = warm_env() if base is None else base
    node = os.environ.get(WARM_START, "1")
    if env.get(WARM_START, base.get(WARM_START, node)) == "0":
        return False
    for key, value in env.items():
        if key == "OMP_NUM_THREADS" or base.get(key) == value:
            continue
        if key.startswith(_STARTUP_PREFIXES):
            return False
    return True


class WarmChild:
    """A rank process forked by the warm process; :meth:`wait` returns its exit code."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.pid = pid  # in the warm process's PID namespace: signal it with :meth:`signal`
        self._conn = conn
        self._reader = conn.makefile("rb")

    def signal(self, number: int) -> None:
        """Have the warm process send signal ``number`` to the child's process group."""
        with contextlib.suppress(OSError):
            self._conn.sendall(json.dumps({"signal": int(number)}).encode() + b"\n")

    def wait(self) -> int:
        """Block until the process exits: its code (``-N``: killed by signal N). If the warm
        process dies first, so did the child (it dies with it): ``-9``."""
        line = self._reader.readline()
        with contextlib.suppress(OSError):
            self._reader.close()
            self._conn.close()
        try:
            return int(json.loads(line)["exit"])
        except (ValueError, KeyError, TypeError):
            return -9


def spawn_warm(
    channel: Path,
    peer: tuple[int, int],
    argv: list[str],
    env: Mapping[str, str],
    cwd: str,
    stdout: Path,
    stderr: Path,
    timeout_s: float = 10.0,
    *,
    cgroup_procs: Sequence[str] = (),
    rlimit_data: int | None = None,
    private_env: Mapping[str, str] | None = None,
) -> WarmChild | None:
    """Ask the warm process listening on ``channel`` to fork ``python -u argv`` (argv[0]: the
    script); None when there is no warm process or it refuses (the caller starts the process
    cold). Nothing is sent before the listener is found to run as ``peer`` (uid, gid): another
    raises :class:`~aicluster.runtime.warm.launchchannel.WrongPeer`. The child's stdout and stderr
    go to the given files, and it joins ``cgroup_procs`` first: all opened here and passed as
    descriptors, so the warm process needs no access to them. ``private_env`` (the job's
    secrets) is added to the child's environment through a memfd that only the child reads: the
    warm process, which serves every job of its tenant, never holds the values. The returned
    child lives as long as this process keeps it: closing (or dying) kills its process group."""
    try:
        conn = connect_channel(channel, peer, timeout_s)
    except OSError:  # no warm process (yet)
        return None
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fds: list[int] = []
    try:
        fds += [os.open(stdout, flags, 0o644), os.open(stderr, flags, 0o644)]
        if private_env:
            fds.append(_memfd(json.dumps(dict(private_env)).encode()))
        fds += [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in cgroup_procs]
        request = {"argv": argv, "env": dict(env), "cwd": cwd, "rlimit_data": rlimit_data}
        request["private_env"] = bool(private_env)  # fds[2] is its memfd
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)
        reader = conn.makefile("rb")
        reply = json.loads(reader.readline() or b"{}")
        reader.close()
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return None
    finally:
        for fd in fds:
            os.close(fd)
    if "pid" not in reply:
        conn.close()
        return None
    return WarmChild(conn, int(reply["pid"]))


def _memfd(data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, at offset 0 (never on disk)."""
    fd = os.memfd_create("aicluster-env", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd


def zygote_command(
    listener_fd: int, name: str, launcher_uid: int, preload: str = PRELOAD
) -> list[str]:
    """The warm process's command line: it imports ``preload``, listens on the inherited, bound
    socket ``listener_fd`` (its launch channel) and serves ``launcher_uid`` alone; ``name``
    labels it."""
    return [sys.executable, _ZYGOTE, str(listener_fd), preload, str(launcher_uid), name]


class WarmStarter:
    """Actor class (one per Ray node and tenant, see :func:`ensure_warm_starter`): keeps the
    node's warm process running, bound to its launch channel, and arms the tripwire on its
    retired abstract name (:class:`~aicluster.runtime.warm.launchchannel.Canary`). Idempotent; the
    warm process dies with this actor."""

    def __init__(
        self,
        name: str,
        state_dir: str,
        sandbox: SandboxSpec | None = None,
        power_report: str | None = None,
        tenant: str | None = None,
        ray_node_id: str = "",
    ) -> None:
        self.name, self.state_dir, self.sandbox = name, state_dir, sandbox
        self.log_dir = log_dir(state_dir)
        self.tenant, self.ray_node_id = tenant, ray_node_id
        self.channel = channel_path(self.log_dir, name)
        self._thread: threading.Thread | None = None
        self._canary = Canary(name, self._alarm)
        self._squat_reported = False
        # The node's own starter also reports its measured power (no process more a node).
        self.power = None if power_report is None else PowerReporter(power_report)

    def ensure(self, power_report: str | None = None) -> str:
        """Start the warm process unless it runs (and the power reporter); returns its socket
        name. ``power_report``: a rank's launch may have made the node's starter before the
        node's warm-up did (with no report), so the warm-up's path is taken here too."""
        if power_report is not None and self.power is None:
            self.power = PowerReporter(power_report)
        elif power_report is not None and self.power is not None:
            self.power.add(power_report)  # another runtime's state directory, same node
        self._canary.arm()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="warm-process", daemon=True)
            self._thread.start()
        if self.power is not None:
            self.power.ensure()
        return self.name

    def _alarm(self, what: str, details: dict[str, object]) -> None:
        if what == "squatted":
            if self._squat_reported:  # the same squatter, seen again at the next ensure()
                return
            self._squat_reported = True
        kind = f"launch_channel.{what}"
        raise_alarm(self.state_dir, kind, self.tenant, self.ray_node_id, details)

    def _run(self) -> None:
        # Spawned from this thread, which lives as long as the process: PR_SET_PDEATHSIG (set by
        # the shim) fires when the spawning *thread* ends.
        env = warm_env()  # OPENBLAS_NUM_THREADS=1: NumPy's BLAS starts no threads to fork
        log = Path(self.log_dir)
        log.mkdir(parents=True, exist_ok=True)
        stem = self.name.replace("/", "-")
        listener = bind_channel(self.channel)  # root's: the warm process only inherits it
        zygote = zygote_command(listener.fileno(), self.name, os.getuid())
        if self.sandbox is None:
            argv = [sys.executable, CHILD_SHIM, *zygote]
            cwd = None
        else:
            argv = [sys.executable, CHILD_SHIM, "--ignore-term", "--"]
            argv += bwrap_argv(self.sandbox, zygote)
            cwd = self.sandbox.workdir
        with (
            listener,
            open(log / f"{stem}.log", "ab") as out,
            open(log / f"{stem}.err", "ab") as err,
        ):
            process = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                pass_fds=(listener.fileno(),),
            )
        process.wait()


def ensure_warm_starter(
    ray_node_id: str,
    state_dir: str | os.PathLike[str],
    tenant: str | None = None,
    sandbox: SandboxSpec | None = None,
    power_report: str | None = None,
) -> Any:
    """Create (or find) the node's :class:`WarmStarter` (``tenant``'s, in ``sandbox``, when
    given) for the runtime of ``state_dir`` and ask it to start the warm process; returns at
    once (nothing is waited for). The node's own starter reports its measured power to
    ``power_report`` (:mod:`..cluster.powermeter`)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from aicluster.runtime.layout import NAMESPACE

    name = socket_name(ray_node_id, tenant, log_dir(state_dir))
    actor = (
        ray.remote(WarmStarter)
        .options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node_id, soft=False),
        )
        .remote(name, str(state_dir), sandbox, power_report, tenant, ray_node_id)
    )
    return actor.ensure.remote(power_report)  # type: ignore[attr-defined]
