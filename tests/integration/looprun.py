"""Driving a live ControlLoop on the session's Ray cluster from a test: one loop over a store,
ticked by the test until something holds, its gangs stopped at the end; jobs of the scripts in
``tests/integration/jobs`` submitted to it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from clusterstate import held
from shipping import JOBS, ship

from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.runtime import Runtime, discover
from aicluster.runtime.cluster.providers import NodeProvider
from aicluster.scheduler import SchedulerConfig
from aicluster.store import JobRecord, Store
from aicluster.store.base import WallClock

STEPS = "steps.py"  # in tests/integration/jobs, shipped as each job's code


def one_backend(name: str) -> pytest.MarkDecorator:
    """A test whose time goes to Ray, not to the store: run it on one backend (the store's own
    tests, and the crash and failover ones, run both)."""
    return pytest.mark.parametrize("store_url", [name], indirect=True)


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


@contextmanager
def two_tenant_loop(store_url: str, runtime: Runtime) -> Iterator[ControlLoop]:
    """A loop on a fresh store at ``store_url`` with tenants ``a`` and ``b``, the priority policy
    and a 3 s stop grace."""
    store = Store.open(store_url)
    for name in ("a", "b"):
        store.create_tenant(Tenant(name), "test")
    with live_loop(store, runtime, SchedulerConfig(queue="priority"), stop_grace_s=3) as control:
        yield control


def submit(
    loop: ControlLoop,
    name: str,
    *,
    tenant: str = "a",
    workers: int = 2,
    gpus: int = 1,
    steps: int = 3,
    exit_code: int = 0,
    priority: str = "normal",
    max_restarts: int = 0,
    extra: tuple[str, ...] = (),
    entrypoint: str = STEPS,
    cpus: float = 0.1,
) -> JobRecord:
    assert loop.runtime is not None
    args = ["--steps", str(steps)]
    if entrypoint == STEPS:
        args += ["--exit-code", str(exit_code)]
    spec = jobspec_from_mapping(
        {
            "name": name,
            "entrypoint": entrypoint,
            "code": ship(loop.runtime.state_dir, tenant, JOBS),
            "workers": workers,
            "args": [*args, *extra],
            "resources": {"gpus": gpus, "cpus": cpus, "memory_gb": 0.1},
            "priority": priority,
            "max_restarts": max_restarts,
        }
    )
    record, _ = loop.store.submit_job(tenant, spec, "tester")
    return record


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
