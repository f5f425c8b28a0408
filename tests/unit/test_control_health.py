"""Hang and straggler detection on synthetic telemetry."""

import random

from aicluster.control.loop.health import GangMonitor, HealthConfig
from aicluster.train.telemetry import StepRecord


def steps(
    monitor: GangMonitor,
    count: int,
    slow_rank: int | None = None,
    slowdown: float = 1.5,
    start: float = 0.0,
    seed: int = 0,
) -> float:
    """Feed ``count`` steps of every rank (0.1 s compute, ±10% noise); returns the end time."""
    rng = random.Random(seed)
    now = start
    first_flag = None
    for step in range(1, count + 1):
        now += 0.2
        for rank in range(monitor.workers):
            compute = 0.1 * rng.uniform(0.9, 1.1) * (slowdown if rank == slow_rank else 1.0)
            record = StepRecord(
                "step",
                rank,
                now,
                step=step,
                step_time=0.2,
                node=f"node-{rank}",
                metrics={"compute_time": compute},
            )
            if monitor.observe([record]) and first_flag is None:
                first_flag = step
    monitor.first_flag = first_flag  # type: ignore[attr-defined]
    return now


def test_a_worker_slowed_by_half_is_flagged_within_20_steps() -> None:
    monitor = GangMonitor(workers=4, started_at=0.0)
    steps(monitor, 40, slow_rank=2, slowdown=1.5)
    assert list(monitor.flagged) == [2]
    assert monitor.first_flag <= 20  # type: ignore[attr-defined]
    assert "rank 2 on node-2" in monitor.flagged[2].describe()


def test_a_healthy_500_step_run_flags_nothing() -> None:
    for seed in range(5):
        monitor = GangMonitor(workers=4, started_at=0.0)
        steps(monitor, 500, seed=seed)
        assert monitor.flagged == {}


def test_hang_is_declared_after_three_median_steps_or_the_floor() -> None:
    monitor = GangMonitor(workers=2, started_at=0.0, config=HealthConfig(hang_floor_s=5))
    end = steps(monitor, 20)
    assert monitor.hung(end + 1) is None
    reason = monitor.hung(end + 6)
    assert reason is not None and "no progress" in reason
    slow = GangMonitor(workers=2, started_at=0.0, config=HealthConfig(hang_floor_s=1))
    for step in range(1, 5):  # 10 s steps: the limit is 3 × 10 s, not the floor
        slow.observe(
            [StepRecord("step", r, step * 10.0, step=step, step_time=10.0) for r in range(2)]
        )
    assert slow.hung(40 + 25) is None and slow.hung(40 + 31) is not None


def test_a_gang_that_never_starts_is_hung_after_the_startup_grace_once_it_said_it_steps() -> None:
    """train.init's start record says the rank will step: its first step is due within the
    startup grace of that record (not of the attempt's start)."""
    monitor = GangMonitor(workers=2, started_at=100.0, config=HealthConfig(startup_grace_s=60))
    monitor.observe([StepRecord("start", rank, 130.0) for rank in range(2)])
    assert monitor.hung(185) is None
    reason = monitor.hung(191)
    assert reason is not None
    assert reason.startswith("rank 0 made no first step 61s after aicluster.train.init said")
    assert "health.startup_grace_s" in reason and "hang_check: off" in reason


def test_a_gang_that_never_says_it_steps_is_never_hung_before_a_step() -> None:
    monitor = GangMonitor(workers=2, started_at=0.0, config=HealthConfig(startup_grace_s=60))
    monitor.observe([StepRecord("checkpoint", 0, 5.0, step=0)])
    assert monitor.hung(10_000) is None


def test_the_shims_stepping_record_starts_the_grace_of_that_rank() -> None:
    monitor = GangMonitor(workers=2, started_at=0.0, config=HealthConfig(startup_grace_s=60))
    monitor.observe([StepRecord("stepping", 1, 500.0)])
    assert monitor.hung(559) is None
    reason = monitor.hung(561) or ""
    assert reason.startswith(
        "rank 1 made no first step 61s after the job made its first torch optimizer"
    )


def test_hang_check_from_start_watches_every_rank_from_the_start() -> None:
    config = HealthConfig(startup_grace_s=60, hang_floor_s=100)
    monitor = GangMonitor(workers=2, started_at=100.0, config=config, hang_check="from_start")
    monitor.observe([StepRecord("step", 0, 120.0, step=1, step_time=1.0)])
    assert monitor.hung(150) is None
    reason = monitor.hung(161) or ""
    assert reason.startswith("rank 1 made no first step 61s after the attempt's start")


def test_hang_check_off_never_calls_a_gang_hung() -> None:
    config = HealthConfig(startup_grace_s=1, hang_floor_s=1)
    monitor = GangMonitor(workers=1, started_at=0.0, config=config, hang_check="off")
    monitor.observe([StepRecord("start", 0, 0.0), StepRecord("step", 0, 1.0, step=1)])
    assert monitor.hung(10_000) is None


def test_a_rank_that_stepped_is_watched_even_without_saying_it_steps() -> None:
    monitor = GangMonitor(workers=1, started_at=0.0, config=HealthConfig(hang_floor_s=30))
    monitor.observe([StepRecord("step", 0, float(s), step=s, step_time=1.0) for s in (1, 2)])
    reason = monitor.hung(2 + 31) or ""
    assert reason.startswith("rank 0 made no progress for 31s after its last step (limit 30s")
    assert "health.hang_factor 3 × the gang's median step 1.0s" in reason
    assert "health.hang_floor_s 30s" in reason


def test_a_straggler_is_named_by_the_node_it_was_placed_on_not_by_its_telemetry() -> None:
    # The loop fills in each rank's node from the launcher's gang spec; a hostile job writes
    # another node's name in its telemetry (steps() writes "node-<rank>"), hoping to have that
    # node cordoned.
    monitor = GangMonitor(workers=4, started_at=0.0)
    monitor.nodes.update({rank: f"placed-{rank}" for rank in range(4)})
    steps(monitor, 40, slow_rank=2, slowdown=1.5)
    assert monitor.flagged[2].node == "placed-2"
    assert monitor.nodes == {rank: f"placed-{rank}" for rank in range(4)}
