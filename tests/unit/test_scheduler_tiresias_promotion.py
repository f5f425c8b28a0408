"""Tiresias promotion restarts a job's attained service, so promoted jobs cannot thrash."""

from __future__ import annotations

from aicluster.core import Job, make_cluster
from aicluster.scheduler import SchedulerConfig, make_state, schedule


def test_a_promoted_job_stays_in_the_top_queue_once_it_runs() -> None:
    config = SchedulerConfig(
        queue="tiresias",
        tiresias_thresholds=(100.0,),
        tiresias_promote_knob=2,
        explain=False,
        min_runtime_s=0,  # preempted 101 s into its run (protections: test_preemption_protection)
        cooldown_s=0,
    )
    state = make_state(make_cluster(nodes=1, gpus_per_node=1), config=config)
    state.submit(Job(id="old", tenant="t", submit_time=0.0), 0.0)
    state.start("old", schedule(state.snapshot(0.0)).admissions[0].placement, 0.0)
    state.stop("old", 200.0, requeue=True)  # attained 200 > 100: queue 1, promoted at 600
    state.refresh(600.0)
    assert state.pending["old"].key[0] == 0
    plan = schedule(state.snapshot(600.0))
    state.start("old", plan.admissions[0].placement, 600.0)
    assert state.running_class["old"] == 0  # its service restarted with the promotion
    # A new job (queue 0, submitted later) must not preempt it: same queue, FIFO within it.
    state.submit(Job(id="new", tenant="t", submit_time=610.0), 610.0)
    state.refresh(610.0)
    plan = schedule(state.snapshot(610.0))
    assert plan.preemptions == [] and plan.admissions == []
    # Once it has earned 100 GPU-seconds again it drops to queue 1 and may be preempted.
    state.refresh(701.0)
    plan = schedule(state.snapshot(701.0))
    assert [p.job_id for p in plan.preemptions] == ["old"]
