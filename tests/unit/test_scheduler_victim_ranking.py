"""Victim ranking in a congested cycle: the candidate list shared by the cycle's jobs drops the
victims already taken without copying the list (``CandidateKinds``), its ranking filtered from
the first list's. The decisions are the plain path's (each list made and ranked anew)."""

from __future__ import annotations

import pytest

from aicluster.core import Job, Slot, VictimKind, make_cluster
from aicluster.scheduler import SchedulerConfig, make_state, schedule
from aicluster.scheduler.preemption import CandidateKinds


def _job(job_id: str, gpus: int, submitted: float) -> Job:
    return Job(id=job_id, tenant="a", workers=1, gpus_per_worker=gpus, submit_time=submitted)


# Each cycle's decisions: (job, right) per preemption, (job, slots) per admission.
Decisions = tuple[tuple[tuple[str, VictimKind], ...], tuple[tuple[str, tuple[Slot, ...]], ...]]


def _congested_cycle(*, shortcuts: bool, max_victims: int) -> list[Decisions]:
    """16 two-GPU nodes, each running a 2-GPU job that ran long enough to drop a Tiresias
    queue, started over seven cycles (so they would lose different work: their ranks differ);
    then six new 2-GPU jobs in the top queue: one cycle preempts one job for each in turn.
    Returns every cycle's decisions."""
    config = SchedulerConfig(
        queue="tiresias",
        tiresias_thresholds=(4.0, 40.0),
        max_victims=max_victims,
        shortcuts=shortcuts,
        explain=False,
        min_runtime_s=0,  # one preemption a cycle, the clock stopped
        cooldown_s=0,
    )
    state = make_state(make_cluster(nodes=16, gpus_per_node=2), {}, config)
    cycles = [(float(t), [f"r{i:02}" for i in range(16) if i % 7 == t]) for t in range(7)]
    cycles.append((100.0, [f"new{n}" for n in range(6)]))
    decisions: list[Decisions] = []
    for now, arrivals in cycles:
        for job_id in arrivals:
            state.submit(_job(job_id, 2, now), now)
        state.refresh(now)
        plan = schedule(state.snapshot(now))
        for preempt in plan.preemptions:
            state.stop(preempt.job_id, now, requeue=True)
        for admit in plan.admissions:
            state.start(admit.job_id, admit.placement, now)
        decisions.append(
            (
                tuple((p.job_id, p.kind) for p in plan.preemptions),
                tuple((a.job_id, a.placement.slots) for a in plan.admissions),
            )
        )
    return decisions


@pytest.mark.parametrize("max_victims", [1, 2, 3, 512])
def test_a_congested_cycle_ranks_victims_as_the_plain_path_does(max_victims: int) -> None:
    fast = _congested_cycle(shortcuts=True, max_victims=max_victims)
    plain = _congested_cycle(shortcuts=False, max_victims=max_victims)
    assert fast == plain
    preempted, admitted = fast[-1]
    # Every new job preempted its way in: several searches shared one list in the cycle.
    assert {job_id for job_id, _ in admitted} >= {f"new{n}" for n in range(6)}
    assert len(preempted) == 6


def test_candidate_kinds_are_the_listed_ones_less_the_taken() -> None:
    listed = {"a": VictimKind.POLICY, "b": VictimKind.PRIORITY, "c": VictimKind.POLICY}
    kinds = CandidateKinds(listed).without({"b", "elsewhere"})
    assert list(kinds) == ["a", "c"]
    assert len(kinds) == 2 and kinds
    assert kinds["c"] is VictimKind.POLICY
    with pytest.raises(KeyError):
        kinds["b"]
    assert not CandidateKinds(listed).without({"a", "b", "c"})
