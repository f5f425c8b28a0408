"""The Ray actor behind one rank: starts the rank's process on its node and reports its exit.

One actor per rank, placed in the rank's placement-group bundle. It runs the entrypoint as a
process of its own (not in the actor): real exit codes and signals, and its stdout/stderr go
straight to files that outlive the actor. The process is forked from the node's warm process
(torch imported already, :mod:`aicluster.runtime.warm`) when there is one, else a fresh
interpreter. A thread waits for the child and
writes its exit record to the run directory, so the exit is known even after the actor is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray

from aicluster.runtime.labels import LABEL_NODE
from aicluster.runtime.rundir import RunDir, write_json_atomic
from aicluster.runtime.warm import ensure_warm_starter, socket_name, spawn_warm, warm_compatible
from aicluster.runtime.warm import log_dir as warm_log_dir
from aicluster.train import env as train_env

__all__ = ["RankWorker"]

_CHILD_SHIM = str(Path(__file__).with_name("_child.py"))


class RankWorker:
    """Actor class (wrapped with ``ray.remote`` by the gang launcher). All methods idempotent."""

    def __init__(self, state_dir: str, job_id: str, attempt: int, rank: int) -> None:
        self.run = RunDir(state_dir, job_id, attempt)
        self._warm_logs = warm_log_dir(state_dir)
        self.rank = rank
        self._pid: int | None = None
        self.warm = False  # whether the process was forked from the node's warm process
        self._spawned = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._spawn_error: str | None = None
        self._stopped = False
        self._port: int | None = None

    def where(self) -> dict[str, str]:
        """The node this actor actually runs on: IP, Ray node id and aicluster node label."""
        context = ray.get_runtime_context()
        return {
            "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "node_id": context.get_node_id(),
            "node": str(context.get_node_labels().get(LABEL_NODE, "")),
        }

    def rendezvous_port(self) -> int:
        """A free TCP port on this node for torch's store (rank 0 only); the same on every call.

        The port is free when chosen and bound by rank 0's process a moment later; that small
        window is the same one ``torchrun --master-port 0`` accepts.
        """
        if self._port is None:
            with socket.socket() as sock:
                sock.bind(("", 0))
                self._port = int(sock.getsockname()[1])
        return self._port

    def start(self, entrypoint: str, args: list[str], env: dict[str, str], cwd: str) -> int:
        """Start the rank's process once (later calls return the same pid; -1 after stop).

        Forked from the node's warm process when there is one (torch already imported, see
        :mod:`aicluster.runtime.warm`), else a fresh ``python -u entrypoint``."""
        if self._stopped:
            return -1
        if self._thread is None:
            where = self.where()
            child_env = {**os.environ, **env, train_env.NODE: where["node"]}
            self._thread = threading.Thread(
                target=self._run,
                args=(entrypoint, args, child_env, cwd, where["node_id"]),
                name="rank-process",
                daemon=True,
            )
            self._thread.start()
            self._spawned.wait()
        if self._spawn_error is not None:
            raise RuntimeError(self._spawn_error)
        assert self._pid is not None
        return self._pid

    def _run(
        self, entrypoint: str, args: list[str], env: dict[str, str], cwd: str, node_id: str
    ) -> None:
        # The child is spawned from this thread, which lives exactly as long as the child:
        # PR_SET_PDEATHSIG fires when the spawning *thread* ends. A warm child is killed by the
        # warm process when this thread's connection closes instead.
        self.run.path.mkdir(parents=True, exist_ok=True)
        stdout = self.run.log_file(self.rank, "stdout")
        stderr = self.run.log_file(self.rank, "stderr")
        warm = None
        script = os.path.join(cwd, entrypoint)  # a missing one fails cold, with Python's error
        if entrypoint.endswith(".py") and os.path.isfile(script) and warm_compatible(env):
            name = socket_name(node_id)
            warm = spawn_warm(name, [entrypoint, *args], env, cwd, stdout, stderr)
            if warm is None:  # none on this node yet (or not ready): start one for the next gang
                with contextlib.suppress(Exception):
                    ensure_warm_starter(node_id, self._warm_logs)
        if warm is not None:
            self._pid, self.warm = warm.pid, True
            self._spawned.set()
            self._write_exit(warm.wait())
            return
        argv = [sys.executable, _CHILD_SHIM, sys.executable, "-u", entrypoint, *args]
        out = open(stdout, "ab")  # noqa: SIM115
        err = open(stderr, "ab")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._pid = proc.pid
        except OSError as error:
            self._spawn_error = f"cannot start rank {self.rank}: {error}"
            self._write_exit(None)
            return
        finally:
            out.close()
            err.close()
            self._spawned.set()
        self._write_exit(proc.wait())

    def _write_exit(self, code: int | None) -> None:
        record: dict[str, Any] = {
            "rank": self.rank,
            "exit_code": code if code is not None else 127,
            "stopped": self._stopped,
            "finished_at": time.time(),
            "pid": self._pid,
            "warm": self.warm,
        }
        write_json_atomic(self.run.exit_file(self.rank), record)
        self._done.set()

    def poll(self) -> dict[str, Any]:
        """``{"state": "pending"|"running"|"exited", "exit_code", "stopped", "pid"}``."""
        if self._pid is None and self._spawn_error is None:
            return {"state": "pending", "exit_code": None, "stopped": self._stopped, "pid": None}
        if not self._done.is_set() and self._pid is not None:
            return {"state": "running", "exit_code": None, "stopped": False, "pid": self._pid}
        record = self.run.exit_record(self.rank) or {}
        return {"state": "exited", **record}

    def terminate(self, grace_s: float) -> dict[str, Any]:
        """SIGTERM the rank's process group, SIGKILL it after ``grace_s``; then :meth:`poll`."""
        self._stopped = True
        pid = self._pid
        if pid is not None and not self._done.is_set():
            _signal_group(pid, signal.SIGTERM)
            if not self._done.wait(grace_s):
                _signal_group(pid, signal.SIGKILL)
                self._done.wait(10.0)
        if pid is not None:
            _signal_group(pid, signal.SIGKILL)  # leftovers of the group (data loaders, ...)
        return self.poll()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
