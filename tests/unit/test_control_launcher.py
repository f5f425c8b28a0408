"""The launcher's per-job ordering, including calls that finish before their callback is set."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from aicluster.control.loop.launcher import Launcher


class InlineExecutor:
    """Runs each call at once: its future is done before ``add_done_callback`` is called."""

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(call())
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def test_a_call_that_is_done_at_once_does_not_deadlock() -> None:
    launcher = Launcher()
    launcher._pool.shutdown()
    launcher._pool = InlineExecutor()  # type: ignore[assignment]
    finished = threading.Event()

    def submit_two() -> None:
        launcher.submit("j1", "stop", 1, lambda: "stopped")
        launcher.submit("j1", "release", 1, lambda: "released")
        finished.set()

    threading.Thread(target=submit_two, daemon=True).start()
    assert finished.wait(5), "submit deadlocked on its own lock"
    outcomes = launcher.collect()
    assert [(o.kind, o.value) for o in outcomes] == [("stop", "stopped"), ("release", "released")]
    assert not launcher.busy("j1")


class CapturingExecutor(InlineExecutor):
    """Runs each call at once, keeping what it raises in its future."""

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(call())
        except Exception as error:
            future.set_exception(error)
        return future


def test_the_guard_refuses_calls_once_leadership_is_gone() -> None:
    """The loop's guard (the leader lease) runs just before each call: a refused call does not
    run and its outcome carries the guard's error."""
    leading = True
    ran: list[str] = []

    def guard() -> None:
        if not leading:
            raise RuntimeError("lease lost")

    launcher = Launcher(guard=guard)
    launcher._pool.shutdown()
    launcher._pool = CapturingExecutor()  # type: ignore[assignment]
    launcher.submit("j1", "launch", 1, lambda: ran.append("j1"))
    leading = False
    launcher.submit("j2", "launch", 1, lambda: ran.append("j2"))
    outcomes = {o.job_id: o for o in launcher.collect()}
    assert ran == ["j1"]
    assert outcomes["j1"].error is None
    assert isinstance(outcomes["j2"].error, RuntimeError)
