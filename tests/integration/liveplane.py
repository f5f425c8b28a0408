"""A live control plane without Ray for API, metrics and dashboard tests.

Real store, real ``ControlLoop`` (scheduling over store-registered nodes, ``runtime=None``), real
run directories. The one fake is at the Ray boundary: :class:`OfflineRuntime` is the real
``Runtime`` minus its Ray connection, so the plane reads telemetry, logs and goodput from run
directories exactly as it does on a cluster; :func:`run_gang` writes what a gang would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from apiserver import users as users  # re-exported: the live-plane tests import it from here

from aicluster.api import ServerSettings
from aicluster.control import ControlPlane
from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import JobState, Node, Tenant, jobspec_from_mapping
from aicluster.runtime import GangSpec, RunDir, Runtime, rank_layout
from aicluster.runtime.rundir import write_json_atomic
from aicluster.scheduler import SchedulerConfig
from aicluster.store import JobRecord, Store, placement_from_json
from aicluster.store.base import WallClock
from aicluster.train.telemetry import TelemetryWriter


class OfflineRuntime(Runtime):
    """The real runtime's readers (gangs, logs, telemetry) over run directories, without Ray."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:  # no Ray connection
        self.state_dir = os.path.abspath(state_dir)
        self.start_timeout_s = 0.0


def racks(pods: int, racks_per_pod: int, nodes_per_rack: int, gpus: int = 8) -> list[Node]:
    return [
        Node(f"node-{p}-{r}-{n}", gpus, "H100", f"rack-{p}-{r}", f"pod-{p}")
        for p in range(pods)
        for r in range(racks_per_pod)
        for n in range(nodes_per_rack)
    ]


def open_live_plane(
    state_dir: Path,
    tenants: list[Tenant],
    nodes: list[Node],
    config: SchedulerConfig | None = None,
    interval_s: float = 0.2,
    follow_config: bool = False,
) -> ControlPlane:
    """A plane whose leader runs a real control loop without Ray (by default: fair queue, EASY
    backfill, preemption; with ``follow_config`` the configuration applied in the store, as a
    server's loop does)."""
    store = Store.open(state_dir)
    for tenant in tenants:
        store.create_tenant(tenant, "test")
    store.upsert_nodes(nodes)
    clock = WallClock()
    config = config or SchedulerConfig(queue="fair", backfill="easy", preemption=True)
    return ControlPlane(
        settings=ServerSettings(state_dir=state_dir),
        store=store,
        clock=clock,
        runtime=OfflineRuntime(state_dir),
        loop_factory=lambda: ControlLoop(
            store,
            None,
            None,
            clock,
            LoopSettings(config, interval_s=interval_s, follow_config=follow_config),
        ),
    )


@contextmanager
def leading(plane: ControlPlane) -> Iterator[ControlPlane]:
    """Run the plane (it takes the leader lease and starts its loop) until the block ends."""
    plane.start()
    wait_for(lambda: plane.loop is not None, "the plane to lead")
    try:
        yield plane
    finally:
        plane.shutdown()


def wait_for(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def submit(
    store: Store, tenant: str, name: str, workers: int, gpus: int, user: str = "test"
) -> str:
    spec = jobspec_from_mapping(
        {
            "name": name,
            "entrypoint": "train.py",
            "workers": workers,
            "resources": {"gpus": gpus, "gpu_type": "H100"},
            "checkpoint_interval": 60,
        }
    )
    job, _ = store.submit_job(tenant, spec, user)
    return job.id


def run_gang(
    plane: ControlPlane,
    job_id: str,
    steps: int = 50,
    slow_rank: int | None = None,
    running: bool = True,
) -> JobRecord:
    """What a launched gang leaves: its run directory (spec, per-rank telemetry with a falling
    loss and checkpoints, logs) and, when ``running``, the store's RUNNING state."""
    job = plane.store.get_job(None, job_id)
    assert job.placement is not None, f"{job_id} is not placed"
    placement = placement_from_json(job.placement)
    spec = GangSpec.for_job(job.to_job(), placement, "train.py", attempt=job.attempt)
    layout = rank_layout(placement, spec.workers, spec.gpus_per_worker)
    run = RunDir(plane.settings.state_dir, job_id, job.attempt)
    run.make_data_dir(job.tenant, None)
    ranks = [{"rank": s.rank, "node": s.node, "local_rank": s.local_rank} for s in layout]
    write_json_atomic(run.spec_file, {**spec.to_dict(), "ranks": ranks})
    for slot in layout:
        writer = TelemetryWriter(run.telemetry_file(slot.rank), slot.rank, slot.node, job.attempt)
        writer.write("start")
        for step in range(1, steps + 1):
            step_time = 0.1 * (3.0 if slot.rank == slow_rank and step > steps // 2 else 1.0)
            loss = 4.0 * (0.95**step) + 0.3
            writer.write("step", step=step, loss=loss, step_time=step_time, samples=32)
            if step % 20 == 0:
                writer.write("checkpoint", step=step)
        writer.close()
        log = run.log_file(slot.rank)
        log.write_text("".join(f"rank {slot.rank} step {s}\n" for s in range(1, steps + 1)))
    if running and job.state is JobState.STARTING:
        job = plane.store.transition(
            job_id, JobState.RUNNING, "runtime", expected_from=JobState.STARTING
        )
    return job
