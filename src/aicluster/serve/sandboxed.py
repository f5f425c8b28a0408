"""A served model's code in its tenant's sandbox, behind a local socket.

A Serve replica is a Ray actor: it holds Ray's credentials and sees the node as root does. The
model's own code is the tenant's, so with the sandbox on (``aicluster up`` without
``--insecure-no-sandbox``) the replica runs it in a worker process of its own
(:mod:`aicluster.serve._model_worker`) in the tenant's sandbox
(:mod:`aicluster.runtime.sandbox.bwrap`), as the tenant's uid: it sees the artifact read-only, a
private ``/tmp`` and the system's files, and nothing of the state directory, Ray or other tenants.
The replica talks to it over a Unix socket pair, one request at a time. ``bench/serve_overhead.py``
measures what that adds.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from aicluster.runtime.environment import base_env
from aicluster.runtime.sandbox.bwrap import CHILD_SHIM, SandboxSpec, bwrap_argv
from aicluster.serve import _model_worker as wire

__all__ = ["SandboxedPredictor", "sandbox_options"]

_WORKER = str(Path(wire.__file__))


def sandbox_options(uid: int, hidden: str) -> dict[str, Any]:
    """What a replica needs to sandbox its model: the tenant's uid (and gid), the state
    directory to hide. Plain data: it travels in the Serve application's arguments."""
    return {"uid": uid, "gid": uid, "hidden": hidden}


def _grant_read(artifact: Path, gid: int) -> None:
    """Let the tenant's group read its own model's artifact (the registry keeps its weights
    0600, root's). The artifact is immutable; links in it are not followed."""
    for folder, dirs, files in os.walk(artifact):
        os.chown(folder, -1, gid, follow_symlinks=False)
        os.chmod(folder, os.stat(folder).st_mode | 0o050)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chown(path, -1, gid)
                os.chmod(path, os.stat(path).st_mode | 0o040)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]


class SandboxedPredictor:
    """``predict``/``check_health`` answered by the model's code in the tenant's sandbox.

    The worker is spawned from a thread of its own that lives as long as the worker: the shim's
    ``PR_SET_PDEATHSIG`` ties the worker to that thread, so it dies with the replica.
    """

    def __init__(self, artifact_dir: str, options: dict[str, Any], timeout_s: float = 120.0):
        self._lock = threading.Lock()
        _grant_read(Path(artifact_dir), int(options["gid"]))
        ours, theirs = socket.socketpair()
        self._conn = ours
        spec = SandboxSpec(
            uid=int(options["uid"]),
            gid=int(options["gid"]),
            workdir="/tmp",
            writable=(),
            hidden=(str(options["hidden"]),),
            exposed=(os.path.realpath(artifact_dir),),
        )
        command = [sys.executable, _WORKER, str(theirs.fileno()), os.path.realpath(artifact_dir)]
        argv = [sys.executable, CHILD_SHIM, "--ignore-term", "--", *bwrap_argv(spec, command)]
        self._started = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(
            target=self._run, args=(argv, theirs), name="model-sandbox", daemon=True
        )
        self._thread.start()
        self._started.wait()
        theirs.close()
        ours.settimeout(timeout_s)
        first = wire.receive(ours)
        ours.settimeout(None)
        if first is None or "ready" not in first:
            why = (first or {}).get("error", "the sandboxed model worker ended before it was ready")
            raise RuntimeError(str(why))

    def _run(self, argv: list[str], theirs: socket.socket) -> None:
        env = {**base_env(), "HOME": "/tmp", "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(
            argv, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL
        )
        self._process = process
        self._started.set()
        process.wait()

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            wire.send(self._conn, message)
            reply = wire.receive(self._conn)
        if reply is None:
            raise RuntimeError("the sandboxed model worker is gone")
        return reply

    def predict(self, inputs: Any) -> Any:
        reply = self._ask({"op": "predict", "inputs": inputs})
        if "invalid" in reply:
            raise ValueError(reply["invalid"])
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply.get("outputs")

    def check_health(self) -> None:
        """The model's own check when the worker is idle; while it answers a request, that the
        worker runs (a slow prediction must not make Serve replace the replica)."""
        if not self._lock.acquire(blocking=False):
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError("the sandboxed model worker is gone")
            return
        try:
            wire.send(self._conn, {"op": "health"})
            reply = wire.receive(self._conn)
        finally:
            self._lock.release()
        if reply is None:
            raise RuntimeError("the sandboxed model worker is gone")
        if "error" in reply:
            raise RuntimeError(reply["error"])
