"""The plan's effects both control loops apply (``scheduler.effects``): the lost-work rule, a
requeue that keeps progress, and the store's form of that progress (``control.loop.progress``)."""

from __future__ import annotations

import math

import pytest

from aicluster.control.loop.progress import progress_from_json, progress_to_json
from aicluster.core import DomainLevel, Placement, Slot
from aicluster.scheduler import (
    Progress,
    SchedulerConfig,
    SchedulerState,
    effects,
    make_state,
    schedule,
)
from builders import make_job, small_cluster

ON_NODE_0 = Placement((Slot("node-0", 8, 0),), DomainLevel.NODE, "node-0")


def running_job(
    state: SchedulerState, *, at: float = 100.0, every: float | None = None, speed: float = 1.0
) -> None:
    state.submit(make_job("j").gpus(8).checkpoint_every(every or math.inf).build(), 0.0)
    effects.admit(state, "j", ON_NODE_0, at, speed)


# (name, run from 100 s to `stopped` at `speed`, last save at `saved`, restore) → kept work,
# lost GPU-s. Work is the job's own seconds (wall progress × speed: a run slowed by its spread
# in the simulator), lost time wall time.
CASES = {
    "saved at the stop: nothing lost": (160.0, 1.0, 160.0, 0.0, 60.0, 0.0),
    "saved 20 s before: 20 s lost": (160.0, 1.0, 140.0, 0.0, 40.0, 20.0 * 8),
    "never saved: the run lost": (160.0, 1.0, -math.inf, 0.0, 0.0, 60.0 * 8),
    "restoring 10 s: that time is neither kept nor lost": (160.0, 1.0, 160.0, 10.0, 50.0, 0.0),
    "a save claimed after the stop counts as the stop": (160.0, 1.0, 900.0, 0.0, 60.0, 0.0),
    "half speed, saved at the stop: half the wall time": (160.0, 0.5, 160.0, 0.0, 30.0, 0.0),
    "half speed, saved 20 s before: 20 wall s lost": (160.0, 0.5, 140.0, 0.0, 20.0, 20.0 * 8),
    "a quarter speed, restoring 20 s first": (160.0, 0.25, 160.0, 20.0, 10.0, 0.0),
}


@pytest.mark.parametrize(
    ("stopped_at", "speed", "saved_at", "restore_s", "kept", "lost"), CASES.values(), ids=CASES
)
def test_the_lost_work_rule(
    stopped_at: float, speed: float, saved_at: float, restore_s: float, kept: float, lost: float
) -> None:
    state = make_state(small_cluster(), config=SchedulerConfig(queue="fifo"))
    running_job(state, speed=speed)
    assert state.running["j"].executed(stopped_at) == pytest.approx((stopped_at - 100.0) * speed)
    stopped = effects.interrupt(state, "j", stopped_at, saved_at=saved_at, restore_s=restore_s)
    assert stopped.progress.executed_seconds == pytest.approx(kept)
    assert stopped.lost_gpu_seconds == pytest.approx(lost)
    # Attained service is wall GPU-seconds, what the job held, however fast it ran.
    assert stopped.progress.attained_gpu_seconds == pytest.approx(8 * (stopped_at - 100.0))
    assert stopped.progress.restarts == 1
    assert "j" not in state.running and "j" not in state.pending
    assert state.index.free[0] == 8  # its GPUs are back at once


def test_a_requeued_job_is_ranked_by_what_it_received_before() -> None:
    """Tiresias puts a job that attained more service in a lower queue: a requeued job keeps
    its attained service, so a fresh job of the same shape goes first."""
    config = SchedulerConfig(queue="tiresias", tiresias_thresholds=(100.0,))
    state = make_state(small_cluster(nodes=1), config=config)
    running_job(state, at=0.0)
    stopped = effects.interrupt(state, "j", 50.0, saved_at=50.0)
    assert stopped.progress.attained_gpu_seconds == 400.0  # over the 100 GPU-s threshold
    effects.requeue(state, make_job("j").gpus(8).build(), stopped.progress, 50.0)
    state.submit(make_job("fresh").gpus(8).at(60.0).build(), 60.0)
    plan = schedule(state.snapshot(60.0))
    assert [a.job_id for a in plan.admissions] == ["fresh"]
    assert state.pending["j"].attained_gpu_seconds == 400.0
    assert state.pending["j"].restarts == 1


def test_a_reported_checkpoint_moves_the_last_save_forward_only() -> None:
    state = make_state(small_cluster(), config=SchedulerConfig(queue="fifo"))
    running_job(state)
    effects.checkpointed(state, "j", 130.0)
    effects.checkpointed(state, "j", 120.0)  # an older report changes nothing
    effects.checkpointed(state, "gone", 120.0)  # nor one of a job no longer running
    assert state.running["j"].last_checkpoint_at == 130.0


def test_a_node_down_takes_its_jobs_out_of_placement() -> None:
    state = make_state(small_cluster(), config=SchedulerConfig(queue="fifo"))
    running_job(state)
    assert effects.node_down(state, "node-0") == ["j"]
    assert not state.index.schedulable[0]
    effects.node_up(state, "node-0")
    assert state.index.schedulable[0]


def test_progress_survives_the_store_and_bad_rows_are_none() -> None:
    progress = Progress(400.0, 50.0, 50.0, 2)
    assert progress_from_json(progress_to_json(progress, 60.0)) == (progress, 60.0)
    good = progress_to_json(progress, 60.0)
    for bad in (None, [], {}, {**good, "restarts": -1}, {**good, "executed_seconds": "1"},
                {**good, "attained_gpu_seconds": math.nan}, {**good, "restarts": True},
                {**good, "requeued_at": -5.0}):  # fmt: skip
        assert progress_from_json(bad) is None
