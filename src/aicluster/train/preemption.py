"""The stop contract: the runtime asks a job to stop, the job saves a checkpoint and exits 0.

The runtime stops a gang (preemption, cancellation, re-placement) with SIGTERM to each rank's
process group and SIGKILL after a grace period (``GangHandle.stop(grace_s)``). :func:`init`
installs a SIGTERM handler that only sets a flag; a training loop polls :func:`should_stop` once
per step, and when it says so saves a final checkpoint, waits for it and returns::

    for step in range(start, steps + 1):
        ...train one step...
        if train.should_stop():
            checkpointer.save(step, model=model, optimizer=optimizer)
            checkpointer.wait()
            break

:func:`should_stop` is collective: SIGTERM reaches ranks at slightly different moments, so the
ranks agree (an all-reduce of the flags, a few bytes on the library's gloo group) and all stop
after the same step. Call it on every rank at the same point of each step.

A script that never calls :func:`should_stop` keeps the default behaviour: the handler sees that
nobody polls and lets SIGTERM terminate the process as before.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

from aicluster.train import _dist

__all__ = ["install_handler", "request_stop", "should_stop", "stop_requested", "uninstall_handler"]

_requested = threading.Event()
_polled = False
_previous: Any = None
_installed = False


def request_stop() -> None:
    """Ask this rank to stop after the current step, as SIGTERM does (tests, custom handlers)."""
    _requested.set()


def stop_requested() -> bool:
    """Whether *this rank* was asked to stop (local, not collective)."""
    return _requested.is_set()


def should_stop() -> bool:
    """Whether the job should checkpoint and exit now: true on every rank if asked on any.

    Collective across the gang (see the module docstring); cheap in a world of one.
    """
    global _polled
    _polled = True
    agreed = _dist.max_int(1 if _requested.is_set() else 0) > 0
    if agreed:
        _requested.set()
    return agreed


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _requested.set()
    if not _polled:  # nobody will look at the flag: terminate as if no handler were installed
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def install_handler() -> bool:
    """Install the SIGTERM handler (main thread only; never over a handler the job installed)."""
    global _previous, _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return _installed
    current = signal.getsignal(signal.SIGTERM)
    if current not in (signal.SIG_DFL, None):
        return False
    _previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
    return True


def uninstall_handler() -> None:
    """Restore the SIGTERM disposition found by :func:`install_handler`; clear the flag."""
    global _installed, _polled
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
        _installed = False
    _polled = False
    _requested.clear()
