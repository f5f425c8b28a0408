"""Driving a live ControlLoop on the session's Ray cluster from a test: one loop over a store,
ticked by the test until something holds, its gangs stopped at the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from clusterstate import held

from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import JobState
from aicluster.runtime import Runtime, discover
from aicluster.runtime.cluster.providers import NodeProvider
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from aicluster.store.base import WallClock


@contextmanager
def live_loop(
    store: Store,
    runtime: Runtime,
    config: SchedulerConfig,
    provider: NodeProvider | None = None,
    **options: Any,
) -> Iterator[ControlLoop]:
    """A loop on ``store`` and the Ray cluster, with ``config``, the node ``provider`` of power
    saving and the other settings given (:class:`LoopSettings`' fields); its gangs are stopped
    and the store closed at the end."""
    settings = LoopSettings(config, **options)
    control = ControlLoop(store, runtime, discover, WallClock(), settings, provider=provider)
    try:
        yield control
    finally:
        for job_id in list(control.gangs.launched):
            handle = runtime.gang(job_id)
            if handle is not None:
                handle.stop(1)
        control.launcher.shutdown()
        control.power.shutdown()
        store.close()


def run_until(loop: ControlLoop, done: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out; queue: {loop.queue}"
        loop.tick()
        time.sleep(0.3)


def wait_until_idle(timeout_s: float = 180) -> None:
    """Wait until the session's Ray cluster holds nothing of earlier tests: no placement group
    left and every CPU and GPU free. A test that compares the live cluster with its twin assumes
    idle nodes; a gang an earlier test stopped can hold its node a while (its actors die, then
    Ray frees the bundle), and a launch onto it would time out unseen by the twin. Each
    resource of the nodes counts (CPUs, simulated GPUs, memory), node markers aside."""
    deadline = time.monotonic() + timeout_s
    while (left := held()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"the cluster still holds what earlier tests left: {left}"


def state_of(loop: ControlLoop, job_id: str) -> JobState:
    return loop.store.get_job(None, job_id).state
