"""Warm starts: rank processes forked from a per-node process that has torch imported already.

Starting a rank's interpreter and importing torch takes seconds, more on a loaded machine, and a
restarted gang pays it on every rank at once. Each Ray node therefore keeps one *warm process*
(``_zygote.py``), held by a detached actor of its own (:class:`WarmStarter`, named
``aicluster-warm/<ray node id>``, no resources). A rank's actor asks it for the rank's process
over an abstract Unix socket (:func:`spawn_warm`) and falls back to a cold ``python -u`` start
when there is none yet (the first gang on a node starts it), when the rank's environment changes
what an interpreter reads at start-up (:func:`warm_compatible`), or when
``AICLUSTER_WARM_START=0``. Either way the rank has the same exit codes, signals, process group,
logs and lifetime (it dies with its actor and its node).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "WARM_START",
    "WarmChild",
    "WarmStarter",
    "ensure_warm_starter",
    "log_dir",
    "socket_name",
    "spawn_warm",
    "warm_compatible",
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
_CHILD_SHIM = str(Path(__file__).with_name("_child.py"))
# Read by an interpreter or a native library when it starts: a forked rank would keep the warm
# process's value. OMP_NUM_THREADS is the exception: the child applies it with set_num_threads.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "MALLOC", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS")


def log_dir(state_dir: str | os.PathLike[str]) -> str:
    """Where the warm processes of a runtime with ``state_dir`` write their logs."""
    return os.path.join(state_dir, "warm")


def socket_name(ray_node_id: str) -> str:
    """The abstract socket (and actor) name of a Ray node's warm process."""
    return f"aicluster-warm/{ray_node_id}"


def warm_compatible(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> bool:
    """Whether a process with environment ``env`` may be forked from a warm process started with
    ``base`` (default: this process's environment, which the node's warm process shares)."""
    base = os.environ if base is None else base
    if env.get(WARM_START, base.get(WARM_START, "1")) == "0":
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
        self.pid = pid
        self._conn = conn
        self._reader = conn.makefile("rb")

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
    name: str,
    argv: list[str],
    env: Mapping[str, str],
    cwd: str,
    stdout: Path,
    stderr: Path,
    timeout_s: float = 10.0,
) -> WarmChild | None:
    """Ask the warm process ``name`` to fork ``python -u argv`` (argv[0]: the script); None when
    there is no warm process or it refuses (the caller starts the process cold). The returned
    child lives as long as this process keeps it: closing (or dying) kills its process group."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(timeout_s)
        conn.connect("\0" + name)
        request = {
            "argv": argv,
            "env": dict(env),
            "cwd": cwd,
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        conn.sendall(json.dumps(request).encode() + b"\n")
        reader = conn.makefile("rb")
        reply = json.loads(reader.readline() or b"{}")
        reader.close()
        conn.settimeout(None)
    except (OSError, ValueError):
        conn.close()
        return None
    if "pid" not in reply:
        conn.close()
        return None
    return WarmChild(conn, int(reply["pid"]))


class WarmStarter:
    """Actor class (one per Ray node, see :func:`ensure_warm_starter`): keeps the node's warm
    process running. Idempotent; the warm process dies with this actor."""

    def __init__(self, name: str, log_dir: str) -> None:
        self.name, self.log_dir = name, log_dir
        self._thread: threading.Thread | None = None

    def ensure(self) -> str:
        """Start the warm process unless it runs; returns its socket name."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="warm-process", daemon=True)
            self._thread.start()
        return self.name

    def _run(self) -> None:
        # Spawned from this thread, which lives as long as the process: PR_SET_PDEATHSIG (set by
        # the shim) fires when the spawning *thread* ends.
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # NumPy's BLAS: no threads to fork
        log = Path(self.log_dir)
        log.mkdir(parents=True, exist_ok=True)
        stem = self.name.replace("/", "-")
        with open(log / f"{stem}.log", "ab") as out, open(log / f"{stem}.err", "ab") as err:
            argv = [sys.executable, _CHILD_SHIM, sys.executable, _ZYGOTE, self.name, PRELOAD]
            process = subprocess.Popen(
                argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
            )
        process.wait()


def ensure_warm_starter(ray_node_id: str, log_dir: str) -> Any:
    """Create (or find) the node's :class:`WarmStarter` and ask it to start the warm process;
    returns at once (nothing is waited for)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from aicluster.runtime.layout import NAMESPACE

    name = socket_name(ray_node_id)
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
        .remote(name, log_dir)
    )
    return actor.ensure.remote()  # type: ignore[attr-defined]
