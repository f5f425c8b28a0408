"""Exec a rank's command so that it dies with the actor that started it.

Run as a plain script (``python _child.py CMD...``), before the user's program replaces it: it
asks Linux to SIGKILL it when its parent thread dies (``PR_SET_PDEATHSIG``, kept across exec), so
a rank never outlives its Ray actor, e.g. after ``ray.kill`` or a lost node. A script rather than
``preexec_fn``, which is unsafe in a process with threads (a Ray worker has many).
Imports only the standard library so it starts fast.
"""

import ctypes
import os
import signal
import sys
import time

__all__: list[str] = []

_PR_SET_PDEATHSIG = 1


def main() -> None:
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(137)
    os.environ["AICLUSTER_SPAWNED_AT"] = repr(time.time())  # train.env.SPAWNED_AT
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
