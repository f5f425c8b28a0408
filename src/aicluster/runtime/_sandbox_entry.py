"""Inside the sandbox, as root: become the tenant, then exec the job (``UID GID CMD...``).

Run by bwrap (see :mod:`aicluster.runtime.sandbox`) with ``python -I -S``. It drops every group,
then the gid, then the uid (the last step leaves no capability behind: a switch from root to
another uid clears them), forbids new privileges (setuid binaries grant nothing), asks to die
with its parent again (a uid change clears that), puts SIGTERM back to its default (bwrap
was made to ignore it so that it survives a SIGTERM meant for the job) and execs ``CMD``.
Written here, not with ``setpriv``, because the signal reset must happen in the same step.
Imports only the standard library.
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38


def main() -> None:
    uid, gid, command = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
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
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
