"""Inside the sandbox, as root: become the tenant, then exec the job (``UID GID FILTER CMD...``).

Run by bwrap (see :mod:`aicluster.runtime.sandbox.bwrap`) with ``python -I -S``. It drops every
group, then the gid, then the uid (the last step leaves no capability behind: a switch from root to
another uid clears them), forbids new privileges (setuid binaries grant nothing), asks to die
with its parent again (a uid change clears that), puts SIGTERM back to its default (bwrap
was made to ignore it so that it survives a SIGTERM meant for the job), installs the seccomp
filter ``FILTER`` (hex of the BPF program libseccomp compiled in the launcher:
:mod:`aicluster.runtime.sandbox.seccomp`) and execs ``CMD``; a filter it cannot install stops it
there. Written here, not with ``setpriv``, because the signal reset must happen in the same step;
the filter is loaded with one ``prctl`` (what ``seccomp_load`` does) because this interpreter runs
isolated from site-packages. Imports only the standard library.
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_filter(libc: ctypes.CDLL, program: bytes) -> bool:
    """Load the BPF ``program`` (``struct sock_filter`` records of 8 bytes) for this process and
    what it execs; needs no new privileges set first."""
    if not program or len(program) % 8:
        return False
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    return int(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)) == 0


def main() -> None:
    uid, gid, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4:]
    try:
        program = bytes.fromhex(sys.argv[3])
    except (IndexError, ValueError):
        program = b""
    if uid <= 0 or gid <= 0 or not command:
        os.write(2, b"sandbox: refusing to run a job as root\n")
        os._exit(126)
    libc = ctypes.CDLL(None, use_errno=True)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != gid:
        os._exit(126)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not _install_filter(libc, program):
        os.write(2, b"sandbox: cannot install the seccomp filter\n")
        os._exit(126)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
