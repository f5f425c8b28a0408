"""Launch channels: how the launcher (root) reaches a tenant's warm process, and no one else.

A rank's launch request carries what must reach only its tenant: the environment, the secrets'
memfd, the descriptors of the rank's logs and its ``cgroup.procs`` files. It travels over a Unix
socket whose *file* lies in a directory only root may enter (:func:`channel_dir`, 0700) and which
only root binds (:func:`bind_channel`, in the :class:`~aicluster.runtime.warm.starter.WarmStarter`
actor). The bound socket is inherited by the warm process, which calls ``listen()`` on it:
Linux records the listener's credentials at ``listen()``, so the launcher, before it sends
anything, checks that the process at the other end runs as the tenant's uid and gid
(:func:`connect_channel`, ``SO_PEERCRED``). A mismatch raises :class:`WrongPeer`: the caller
sends nothing, raises an alarm (:mod:`aicluster.runtime.alarms`) and starts the rank cold.

Earlier versions used an abstract socket name (``@aicluster-warm/<node>/<tenant>.<scope>``):
abstract names have no permissions and belong to whoever binds first, so a job of another tenant
could bind a tenant's name before its warm process did and receive its launches. Those names are
now a tripwire (:class:`Canary`): root holds each one, and a process that connects to it, or holds
it before root could, is an alarm.

Why not a socket pair: the warm process is started by the ``WarmStarter`` actor, while ranks are
started by their own actors (other processes); a named socket with a root-only path is what lets
any of the node's launchers reach it without a broker in between.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Canary",
    "Credentials",
    "WrongPeer",
    "bind_channel",
    "channel_dir",
    "channel_path",
    "connect_channel",
    "peer_credentials",
]

_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True, slots=True)
class Credentials:
    """A peer's process id, user and group (as ``SO_PEERCRED`` reports them)."""

    pid: int
    uid: int
    gid: int


class WrongPeer(Exception):
    """The process listening on a launch channel is not the one expected: nothing was sent."""

    def __init__(self, path: str, expected: tuple[int, int], found: Credentials) -> None:
        super().__init__(
            f"launch channel {path}: the listener runs as uid {found.uid} gid {found.gid} "
            f"(pid {found.pid}), expected uid {expected[0]} gid {expected[1]}"
        )
        self.path, self.expected, self.found = path, expected, found


def channel_dir(warm_logs: str | os.PathLike[str]) -> Path:
    """The directory of a runtime's launch channels (under its warm processes' log directory)."""
    return Path(warm_logs) / "channels"


def channel_path(warm_logs: str | os.PathLike[str], name: str) -> Path:
    """The socket file of the warm process called ``name`` (see ``warm.socket_name``): a digest,
    so that the path stays short whatever the tenant's name and the state directory."""
    return (
        channel_dir(warm_logs)
        / hashlib.sha256(name.encode(errors="surrogatepass")).hexdigest()[:32]
    )


def peer_credentials(conn: socket.socket) -> Credentials:
    """The credentials of the process at the other end of a connected Unix socket."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    return Credentials(*_CREDS.unpack(raw))


def _private_dir(path: Path) -> int:
    """Make ``path`` (and its parents) exist, owned by this process's uid, mode 0700; returns an
    ``O_PATH`` descriptor of it. Raises PermissionError when another user owns it (someone made
    it before us: nothing is bound or connected through it)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to the launcher")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _through(fd: int, leaf: str) -> str:
    # Unix socket paths are limited to 107 bytes; the state directory may be longer. The
    # directory's descriptor resolves the same file by a short path.
    return f"/proc/self/fd/{fd}/{leaf}"


def bind_channel(path: Path) -> socket.socket:
    """A Unix stream socket bound to ``path`` (in a directory only this uid may enter), not
    listening yet: its inheritor (the warm process) listens, so that the credentials a launcher
    reads are the inheritor's. A stale socket file of an earlier warm process is replaced."""
    fd = _private_dir(path.parent)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        target = _through(fd, path.name)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(target).st_mode):
                os.unlink(target)
        listener.bind(target)
        os.chmod(target, 0o600)
    except BaseException:
        listener.close()
        raise
    finally:
        os.close(fd)
    return listener


def connect_channel(
    path: Path, expected: tuple[int, int], timeout_s: float = 10.0
) -> socket.socket:
    """Connect to the warm process listening on ``path`` and check that it runs as
    ``expected`` (uid, gid) before anything is sent. Raises OSError when no one listens (no warm
    process yet) and :class:`WrongPeer` when someone else does."""
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise PermissionError(errno.EACCES, f"{path.parent} is not the launcher's own")
        conn.settimeout(timeout_s)
        conn.connect(_through(fd, path.name))
        found = peer_credentials(conn)
        if (found.uid, found.gid) != expected:
            raise WrongPeer(str(path), expected, found)
    except BaseException:
        conn.close()
        raise
    finally:
        os.close(fd)
    return conn


class Canary:
    """Holds a retired abstract socket name (a tripwire): ``on_alarm(what, details)`` is called
    when someone held the name before us (``squatted``) or connects to it (``probed``, with the
    caller's uid). Abstract names live in a network namespace: this sees the jobs that share
    the node's. A job that connects in a loop raises one alarm a minute per uid, the next one
    counting the connections in between (``repeated``): a flood of alarms must not flood the
    event log."""

    #: Seconds between two ``probed`` alarms for one uid.
    QUIET_S = 60.0

    def __init__(
        self,
        name: str,
        on_alarm: Callable[[str, dict[str, object]], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name, self.on_alarm, self.monotonic = name, on_alarm, monotonic
        self._listener: socket.socket | None = None
        self._alarmed_at: dict[int, float] = {}  # by uid
        self._repeated: dict[int, int] = {}

    def arm(self) -> bool:
        """Bind the name and watch it from a daemon thread; False (and a ``squatted`` alarm)
        when another process holds it, or when it cannot be bound. Idempotent."""
        if self._listener is not None:
            return True
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind("\0" + self.name)
            listener.listen(8)
        except OSError as error:
            listener.close()
            if error.errno == errno.EADDRINUSE:
                self.on_alarm("squatted", {"name": self.name})
            return False
        self._listener = listener
        threading.Thread(target=self._watch, name="launch-canary", daemon=True).start()
        return True

    def _watch(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                found = peer_credentials(conn)
            self.probed(found)

    def probed(self, found: Credentials) -> None:
        """A connection from ``found``: an alarm, unless one for its uid is under a minute old."""
        now = self.monotonic()
        last = self._alarmed_at.get(found.uid)
        if last is not None and now - last < self.QUIET_S:
            self._repeated[found.uid] = self._repeated.get(found.uid, 0) + 1
            return
        self._alarmed_at[found.uid] = now
        details: dict[str, object] = {"name": self.name, "uid": found.uid, "pid": found.pid}
        details["repeated"] = self._repeated.pop(found.uid, 0)
        self.on_alarm("probed", details)
