"""Exec a rank's command so that it dies with the actor that started it.

Run as a plain script (``python _child.py CMD...``), before the user's program replaces it: it
asks Linux to SIGKILL it when its parent thread dies (``PR_SET_PDEATHSIG``, kept across exec), so
a rank never outlives its Ray actor, e.g. after ``ray.kill`` or a lost node. A script rather than
``preexec_fn``, which is unsafe in a process with threads (a Ray worker has many).
Imports only the standard library so it starts fast.

Options before ``--`` (for a sandboxed rank, see :mod:`aicluster.runtime.sandbox.bwrap`):
``--cgroup FILE`` writes this process into a cgroup's ``cgroup.procs`` (so the limits hold from
the first instruction of the command on), ``--rlimit-data BYTES`` caps the memory it allocates
where no cgroup could be made, ``--ignore-term`` makes SIGTERM ignored (bwrap inherits that and
survives a SIGTERM meant for the job).
"""

import ctypes
import os
import resource
import signal
import sys
import time

__all__: list[str] = []

_PR_SET_PDEATHSIG = 1


def _options(argv: list[str]) -> list[str]:
    """Apply the options before ``--``; returns the command."""
    if not argv or argv[0] not in ("--cgroup", "--ignore-term", "--rlimit-data", "--"):
        return argv
    while argv and argv[0] != "--":
        if argv[0] == "--cgroup":
            with open(argv[1], "w") as procs:
                procs.write(str(os.getpid()))
            argv = argv[2:]
        elif argv[0] == "--rlimit-data":
            limit = int(argv[1])
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            argv = argv[2:]
        elif argv[0] == "--ignore-term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            argv = argv[1:]
        else:
            raise SystemExit(f"_child.py: unknown option {argv[0]!r}")
    return argv[1:]


def main() -> None:
    command = _options(sys.argv[1:])
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(137)
    os.environ["AICLUSTER_SPAWNED_AT"] = repr(time.time())  # train.env.SPAWNED_AT
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
