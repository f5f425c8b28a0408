"""Work inside a network namespace from a thread of this process: no fork, no exec.

A namespace is a per-thread attribute: a thread that ``setns(2)``'s (or ``unshare(2)``'s) into
one creates its sockets there, netlink ones included, while the process's other threads stay
where they were. So the launcher makes and configures a job's namespace from a short-lived
thread, instead of a child process per step (``ip netns exec``, ``nsenter``, pyroute2's
``NetNS``), each of which forks a large process: under load that cost tens to hundreds of
milliseconds per step (``docs/benchmarks.md``). Python 3.11 has no ``os.setns``/``os.unshare``:
libc through ctypes.

A namespace is named as iproute2 names it (``ip netns``): a bind mount of the thread's
``/proc/thread-self/ns/net`` on ``/run/netns/<name>``, that directory a shared mount point.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["NETNS_DIR", "in_netns", "in_new_netns", "netns_path", "remove_netns"]

NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_SHARED = 1 << 20
_MNT_DETACH = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
T = TypeVar("T")


def netns_path(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a namespace name: {name!r}")
    return f"{NETNS_DIR}/{name}"


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _in_thread(enter: Callable[[], None], work: Callable[[], T]) -> T:
    """``work()``'s result (or exception), run in a new thread after ``enter()``; the thread,
    and with it its place in the namespace, ends with it."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            enter()
            outcome.append(work())
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=body, name="jobnet-netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def in_netns(name: str, work: Callable[[], T]) -> T:
    """``work()`` run in the named namespace."""
    path = netns_path(name)

    def enter() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(fd, _CLONE_NEWNET), f"setns {path}")
        finally:
            os.close(fd)

    return _in_thread(enter, work)


def _shared_netns_dir() -> None:
    """``/run/netns`` a shared mount point, so that a name mounted in it is seen by every mount
    namespace (iproute2 does the same)."""
    os.makedirs(NETNS_DIR, mode=0o755, exist_ok=True)
    run_dir = NETNS_DIR.encode()
    if _libc.mount(b"none", run_dir, None, _MS_SHARED | _MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:  # EINVAL: not a mount point yet
        _check(-1, f"mount --make-shared {NETNS_DIR}")
    _check(_libc.mount(run_dir, run_dir, b"none", _MS_BIND | _MS_REC, None), "bind /run/netns")
    _check(_libc.mount(b"none", run_dir, None, _MS_SHARED | _MS_REC, None), "share /run/netns")


def in_new_netns(name: str, work: Callable[[], T]) -> T:
    """``work()`` run in a new namespace, named ``name`` first (an error if the name exists)."""
    path = netns_path(name)
    _shared_netns_dir()
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))

    def enter() -> None:
        _check(_libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        _check(
            _libc.mount(b"/proc/thread-self/ns/net", path.encode(), b"none", _MS_BIND, None),
            f"bind the namespace on {path}",
        )

    try:
        return _in_thread(enter, work)
    except BaseException:
        remove_netns(name)
        raise


def remove_netns(name: str) -> bool:
    """Unmount and remove the name (the namespace ends once nothing else holds it); whether
    there was one."""
    path = netns_path(name)
    _libc.umount2(path.encode(), _MNT_DETACH)  # fails harmlessly when not mounted
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
