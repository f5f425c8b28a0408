"""A node's warm process: torch already imported, it forks rank processes on request.

Run as a plain script (``python _zygote.py FD PRELOAD [LAUNCHER_UID [NAME]]``), started by the
node's :class:`~aicluster.runtime.warm.starter.WarmStarter` actor through the ``_child.py`` shim (so
it dies with that actor). It imports the modules in ``PRELOAD`` (comma-separated, ``torch`` by
default) once, then listens on ``FD``, an inherited Unix socket its starter (root) bound to the
launch channel's file (:mod:`aicluster.runtime.warm.launchchannel`): listening here makes this
process's uid the one a launcher checks before it sends anything. ``NAME`` only labels the process
in its logs. Each connection asks for one rank process::

    -> {"argv": [script, *args], "env": {...}, "cwd": ..., "rlimit_data": null,
        "private_env": false}\\n
       with descriptors (SCM_RIGHTS): stdout, stderr, with "private_env" a memfd of JSON
       variables (the job's secrets: only the child reads it), then cgroup.procs files to join
    <- {"pid": 1234}\\n  ... later ...  {"exit": code}\\n      (or {"error": "..."}\\n)
    -> {"signal": 15}\\n   (any time after the pid: signal the child's process group)

The child is a fork of this process: it joins the given cgroups, ``os.setsid()``, stdout/stderr
to the given descriptors (opened by the asker: this process may not be able to open them),
the environment replaced, ``sys.argv`` and ``sys.path[0]`` as ``python script.py`` sets them, then
the script runs as ``__main__`` and the interpreter exits as after ``python -u script.py``: the
script's exit code, 1 and a traceback on an exception, ``-N`` when killed by signal N.
A rank saves the seconds of starting an interpreter and importing torch (most of a restart on a
loaded machine); the stdlib's ``multiprocessing`` forkserver does the same, but its children
report to the process that asked, and here the asker (a rank's actor) must learn the exit code.

Lifetimes: a child dies with this process (``PR_SET_PDEATHSIG``), and when the connection that
asked for it closes (its actor died) its process group is SIGKILLed, so a rank never outlives its
actor or its node. Fork safety: this process runs no threads (the starter sets
``OPENBLAS_NUM_THREADS=1`` for NumPy's BLAS, the only library here that starts threads on
import); it refuses to fork when it finds more than one. Only connections from the launcher's
uid (``LAUNCHER_UID``, default this process's own) are served (``SO_PEERCRED``). Imports only
the standard library besides ``PRELOAD`` (and the step timing shim ``_steptime.py``, installed in
each child before its script runs).
"""

import contextlib
import ctypes
import gc
import importlib.util
import json
import os
import resource
import runpy
import selectors
import signal
import socket
import struct
import sys
import time
from typing import Any

__all__: list[str] = []

_PR_SET_PDEATHSIG = 1


class _Forked(Exception):  # raised in the child only, to leave the server's frames
    def __init__(self, request: dict[str, Any], at: float, fds: list[int]) -> None:
        super().__init__()
        self.request, self.at, self.fds = request, at, fds


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the asker is gone: its child was (or is) killed
        conn.sendall(json.dumps(message).encode() + b"\n")


class _Server:
    def __init__(self, listener_fd: int, launcher_uid: int) -> None:
        self.listener = socket.socket(fileno=listener_fd)  # bound by the starter, not listening
        self.listener.set_inheritable(False)  # a rank never holds its tenant's channel
        self.listener.listen(64)  # SO_PEERCRED, as a launcher reads it: this process's
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.buffers: dict[socket.socket, bytes] = {}
        self.fds: dict[socket.socket, list[int]] = {}
        self.pid_of: dict[socket.socket, int] = {}
        self.conn_of: dict[int, socket.socket] = {}
        self.uid = launcher_uid

    def serve(self, parent: int) -> None:
        while os.getppid() == parent:
            for key, _ in self.selector.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    while True:
                        try:
                            if not os.read(self.wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                else:
                    self._readable(key.fileobj)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", creds)
        if uid != self.uid:  # only root reaches the channel's file: say so in the log
            print(f"warm process: refused pid {pid} of uid {uid}", file=sys.stderr, flush=True)
            conn.close()
            return
        self.buffers[conn] = b""
        self.fds[conn] = []
        self.selector.register(conn, selectors.EVENT_READ, "conn")

    def _readable(self, conn: socket.socket) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 8)
        except OSError:
            data, fds = b"", []
        self.fds[conn] += fds
        if not data:  # the asker is gone (its actor died): its rank goes with it
            self._drop(conn)
            return
        self.buffers[conn] += data
        if conn in self.pid_of:  # only signals are expected once the child runs
            self._signals(conn)
            return
        if b"\n" not in self.buffers[conn]:
            return
        line, self.buffers[conn] = self.buffers[conn].split(b"\n", 1)
        try:
            request = json.loads(line)
        except ValueError as error:
            _send(conn, {"error": f"bad request: {error}"})
            self._drop(conn)
            return
        if _threads() != 1:
            _send(conn, {"error": f"{_threads()} threads in the warm process: fork is unsafe"})
            self._drop(conn)
            return
        fds = self.fds.pop(conn, [])
        self.fds[conn] = []
        if len(fds) < 2:
            _send(conn, {"error": "no stdout and stderr descriptors"})
            self._close_fds(fds)
            self._drop(conn)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own session, then drop the server's files and frames
            forked_at = time.time()
            os.setsid()
            _die_with_parent()
            os.close(ready_r)
            os.write(ready_w, b"1")
            os.close(ready_w)
            signal.set_wakeup_fd(-1)
            self.selector.close()
            for item in (self.listener, *self.buffers):
                item.close()
            for pending in self.fds.values():  # other asks' descriptors are not this child's
                self._close_fds(pending)
            os.close(self.wake_r)
            os.close(self.wake_w)
            raise _Forked(request, forked_at, fds)
        self._close_fds(fds)
        os.close(ready_w)
        os.read(ready_r, 1)  # the child leads its session: a killpg of its pid reaches it
        os.close(ready_r)
        self.pid_of[conn], self.conn_of[pid] = pid, conn
        _send(conn, {"pid": pid})

    def _signals(self, conn: socket.socket) -> None:
        """Apply the ``{"signal": N}`` lines the asker sent for its child."""
        *lines, self.buffers[conn] = self.buffers[conn].split(b"\n")
        for line in lines:
            try:
                number = int(json.loads(line)["signal"])
            except (ValueError, KeyError, TypeError):
                continue
            with contextlib.suppress(OSError, ValueError):
                os.killpg(self.pid_of[conn], number)

    @staticmethod
    def _close_fds(fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _drop(self, conn: socket.socket) -> None:
        pid = self.pid_of.pop(conn, None)
        if pid is not None:
            self.conn_of.pop(pid, None)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        self.buffers.pop(conn, None)
        self._close_fds(self.fds.pop(conn, []))
        self.selector.unregister(conn)
        conn.close()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.conn_of.pop(pid, None)
            if conn is not None:
                self.pid_of.pop(conn, None)
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                self._close(conn)


def _become(request: dict[str, Any], zygote: int, forked_at: float, fds: list[int]) -> None:
    """In the forked child: leave the server behind and look like ``python -u script``."""
    if os.getppid() != zygote:  # the warm process died before prctl took effect
        os._exit(137)
    private: dict[str, str] = {}
    if request.get("private_env") and len(fds) > 2:
        with os.fdopen(fds.pop(2), "rb") as memfd:
            private = json.loads(memfd.read())
    for procs in fds[2:]:  # the rank's cgroups first: its limits hold before its code runs
        os.write(procs, b"0")
        os.close(procs)
    limit = request.get("rlimit_data")
    if isinstance(limit, int) and limit > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    for number in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, opened in ((0, devnull), (1, fds[0]), (2, fds[1])):
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.__stdin__ = sys.stdin  # type: ignore[misc]
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = open(fd, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        stream.reconfigure(write_through=True)  # as python -u
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(private)
    os.environ["AICLUSTER_SPAWNED_AT"] = repr(forked_at)  # train.env.SPAWNED_AT
    os.environ["AICLUSTER_WARM_STARTED"] = "1"  # train.env.WARM_STARTED
    argv = [str(arg) for arg in request["argv"]]
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # torch read the warm process's value at import


def _load_steptime(here: str) -> Any:
    """The step timing shim (``_steptime.py``, standard library only), loaded from its file:
    this package's directory is not on ``sys.path``. None if it cannot be loaded."""
    try:
        spec = importlib.util.spec_from_file_location(
            "aicluster_steptime", os.path.join(os.path.dirname(here), "gang", "_steptime.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except Exception as error:
        print(f"warm process: no step timing ({error})", file=sys.stderr)
        return None


def main() -> None:
    listener_fd, preload = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "torch"
    launcher_uid = int(sys.argv[3]) if len(sys.argv) > 3 else os.getuid()
    name = sys.argv[4] if len(sys.argv) > 4 else f"fd {listener_fd}"
    parent = os.getppid()
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]  # this package's modules (status.py, worker.py, ...) must shadow nothing
    for module in filter(None, preload.split(",")):
        try:
            __import__(module)
        except Exception as error:  # a rank imports it itself then (and reports the error)
            print(f"warm process: cannot preload {module}: {error}", file=sys.stderr)
    steptime = _load_steptime(here)
    gc.freeze()  # what was imported stays out of the collector: fewer copy-on-write faults
    try:
        server = _Server(listener_fd, launcher_uid)
    except OSError as error:
        print(f"warm process: cannot listen on {name!r}'s channel ({error})", file=sys.stderr)
        return
    print(f"warm process {name!r} ready (pid {os.getpid()})", flush=True)
    zygote = os.getpid()
    try:
        server.serve(parent)
        return
    except _Forked as forked:
        request, forked_at, fds = forked.request, forked.at, forked.fds
    del server
    _become(request, zygote, forked_at, fds)
    del request
    if steptime is not None:
        with contextlib.suppress(Exception):
            steptime.install()  # time steps and collective waits (a no-op without torch)
    script = sys.argv[0]
    if steptime is None:
        runpy.run_path(script, run_name="__main__")
    else:  # the job's traceback without this process's frames (steptime.run_job_code)
        steptime.run_job_code(lambda: runpy.run_path(script, run_name="__main__"))


if __name__ == "__main__":
    _die_with_parent()
    main()
