"""Tiresias promotion restarts a job's attained service, so promoted jobs cannot thrash; the
promotion wait grows with each requeue, so promotions settle under overload."""

from __future__ import annotations

import math
from dataclasses import replace

from aicluster.core import Job, make_cluster
from aicluster.scheduler import Progress, SchedulerConfig, make_state, schedule
from aicluster.sim import SimConfig, TraceJob, simulate, summarize


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


def test_each_requeue_past_the_first_few_multiplies_the_promotion_wait() -> None:
    config = SchedulerConfig(
        queue="tiresias",
        tiresias_thresholds=(100.0,),
        tiresias_promote_knob=2,
        tiresias_promote_backoff_after=1,
        explain=False,
    )

    def rekey_at(config: SchedulerConfig, restarts: int) -> float | None:
        state = make_state(make_cluster(nodes=1, gpus_per_node=1), config=config)
        progress = Progress(200.0, 700.0, 700.0, restarts)
        state.submit(Job(id="j", tenant="t"), 50.0, progress=progress)
        return state.policy.rekey_at(state.pending["j"])

    # Its fourth wait, three past the first: 2 x its last run (700 s) x 2^3.
    assert rekey_at(config, 4) == 50.0 + 2 * 700.0 * 8
    assert rekey_at(config, 1) == 50.0 + 2 * 700.0
    assert rekey_at(replace(config, tiresias_promote_backoff=1), 4) == 50.0 + 2 * 700.0
    eight_free = replace(config, tiresias_promote_backoff_after=8)  # the default
    assert rekey_at(eight_free, 8) == 50.0 + 2 * 700.0
    assert rekey_at(eight_free, 10) == 50.0 + 2 * 700.0 * 4
    # A job requeued thousands of times (a service that keeps failing) waits long, not for an
    # OverflowError: the growth stops at 2^64.
    assert rekey_at(config, 5000) == 50.0 + 2 * 700.0 * 2.0**64
    state = make_state(make_cluster(nodes=1, gpus_per_node=1), config=config)
    state.submit(Job(id="j", tenant="t"), 50.0, progress=Progress(200.0, 700.0, 700.0, 4))
    state.refresh(50.0 + 2 * 700.0 * 8 - 1)
    assert state.pending["j"].key[0] == 1
    state.refresh(50.0 + 2 * 700.0 * 8)
    assert state.pending["j"].key[0] == 0


def test_promotions_settle_on_a_cluster_over_capacity_for_months() -> None:
    """Eight 100-hour jobs of 8 GPUs on one 8-GPU node: with a constant promotion wait (the
    paper's) each promotion preempts a job that is promoted in turn, and they churn for as
    long as the overload lasts; with the wait doubling per requeue past the eighth, no job is
    requeued more than 8 + 1 + log2(T / (knob x min_runtime_s)) times in a span T."""
    trace = [TraceJob(f"long-{i}", 0, 360_000, 8, "a") for i in range(8)]
    quiet = SimConfig(failures=False, restart_overhead=60.0, checkpoint_interval=300.0)
    churned = simulate(
        make_cluster(nodes=1),
        trace,
        scheduler=SchedulerConfig(queue="tiresias", tiresias_promote_backoff=1),
        config=quiet,
    )
    assert max(churned.jobs.restarts) > 50
    config = SchedulerConfig(queue="tiresias")
    assert (config.tiresias_promote_backoff, config.tiresias_promote_backoff_after) == (2, 8)
    settled = simulate(make_cluster(nodes=1), trace, scheduler=config, config=quiet)
    span = max(settled.jobs.end)
    bound = 8 + 1 + math.log2(span / (config.tiresias_promote_knob * config.min_runtime_s))
    assert max(settled.jobs.restarts) <= bound, (list(settled.jobs.restarts), bound)
    assert summarize(settled)["jct_mean"] < summarize(churned)["jct_mean"]
