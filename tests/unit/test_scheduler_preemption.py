"""Preemption: reclaim and priority (the cycle's own), and a policy's right to preempt (Tiresias,
SRTF). One table of named cases per extension point: add a row."""

from dataclasses import replace

import pytest

from aicluster.core import PendingCode, Tenant, VictimKind
from builders import Case, check, decide, make_job, preempted, small_cluster

QUOTAS = {
    "a": Tenant("a", quota={"H100": 8}),
    "b": Tenant("b", quota={"H100": 8}),
}
# Tenant b fills two nodes with 1-GPU jobs, one cycle each: 8 in quota, 8 borrowed from a.
B_FILLS_TWO_NODES = tuple(make_job(f"b{i}").gpus(1).tenant("b").at(i) for i in range(16))

PREEMPTION = {
    "reclaim frees exactly the owner's quota": Case(
        cluster=small_cluster(nodes=2),
        tenants=QUOTAS,
        running=B_FILLS_TWO_NODES,
        submit=(make_job("owner").gpus(8).tenant("a").at(100),),
        at=100,
        admits=("owner",),
        victims=8,
        kind=VictimKind.RECLAIM,
        used={"a": 8, "b": 8},  # b is back at exactly its quota
    ),
    "reclaim takes as few victims as the job needs": Case(
        cluster=small_cluster(nodes=2),
        tenants=QUOTAS,
        running=B_FILLS_TWO_NODES,
        submit=(make_job("owner").gpus(4).tenant("a").at(100),),
        at=100,
        admits=("owner",),
        victims=4,
        kind=VictimKind.RECLAIM,
    ),
    "in-quota jobs of others are never reclaimed": Case(
        tenants=QUOTAS,
        running=tuple(make_job(f"b{i}").gpus(1).tenant("b") for i in range(8)),
        submit=(make_job("a-big").gpus(8).tenant("a").priority(400),),
        preempts=(),
        waits={"a-big": PendingCode.NO_CAPACITY},
    ),
    "priority takes the lowest-priority victim": Case(
        running=(make_job("low").gpus(4).priority(100), make_job("mid").gpus(4).priority(200)),
        submit=(make_job("urgent").gpus(4).priority(300),),
        preempts=("low",),
        kind=VictimKind.PRIORITY,
        admits=("urgent",),
    ),
    "the most recently checkpointed victim loses least": Case(
        running=(
            make_job("stale").gpus(4).priority(100).at(0),
            make_job("fresh").gpus(4).priority(100).at(10),
        ),
        checkpoints={"fresh": 95, "stale": 50},
        submit=(make_job("urgent").gpus(4).priority(300).at(100),),
        at=100,
        preempts=("fresh",),  # loses 5 s of work; "stale" would lose 50 s
    ),
    "non-preemptible jobs are never victims": Case(
        running=(make_job("keep").gpus(8).priority(100).not_preemptible(),),
        submit=(make_job("urgent").gpus(8).priority(300),),
        preempts=(),
    ),
    "priority never preempts a higher priority": Case(
        running=(make_job("high").gpus(8).priority(300),),
        submit=(make_job("low").gpus(8).priority(100),),
        preempts=(),
        waits={"low": PendingCode.NO_CAPACITY},
    ),
}

TIRESIAS = {"queue": "tiresias", "tiresias_thresholds": (800.0,)}

POLICY_PREEMPTION = {
    "tiresias: a job in the same queue does not preempt": Case(
        config=TIRESIAS,
        running=(make_job("old").gpus(8).at(0),),
        submit=(make_job("new").gpus(8).at(50),),
        at=50,
        admits=(),
        preempts=(),
    ),
    "tiresias: a demoted long runner is preempted by a new job": Case(
        config=TIRESIAS,  # 8 GPUs × 100 s = 800 GPU-seconds: "old" drops to queue 1 after t=100
        running=(make_job("old").gpus(8).at(0),),
        submit=(make_job("new").gpus(8).at(50),),
        at=101,
        admits=("new",),
        preempts=("old",),
        says={"old": "tiresias"},
    ),
    "srtf: the job with more time left is preempted": Case(
        config={"queue": "srtf"},
        running=(make_job("long").gpus(8).duration(1000),),
        submit=(make_job("short").gpus(8).duration(100).at(10),),
        at=10,
        admits=("short",),
        preempts=("long",),
    ),
    "srtf: a job with more time left does not preempt": Case(
        config={"queue": "srtf"},
        running=(make_job("short").gpus(8).duration(100),),
        submit=(make_job("long").gpus(8).duration(1000).at(10),),
        at=10,
        admits=(),
        preempts=(),
    ),
}


@pytest.mark.parametrize("case", PREEMPTION.values(), ids=PREEMPTION.keys())
def test_preemption(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", POLICY_PREEMPTION.values(), ids=POLICY_PREEMPTION.keys())
def test_policy_preemption(case: Case) -> None:
    check(case)


def test_reclaimed_victims_share_the_node_the_owner_lands_on() -> None:
    case = PREEMPTION["reclaim takes as few victims as the job needs"]
    before, _ = decide(replace(case, submit=()))  # where b's jobs ran before the owner came
    _, plan = decide(case)
    (node,) = plan.admissions[0].placement.nodes
    assert {before.node_of(victim) for victim in preempted(plan)} == {(node,)}


def test_tiresias_wakes_the_cycle_when_a_runner_crosses_a_threshold() -> None:
    _, plan = decide(POLICY_PREEMPTION["tiresias: a job in the same queue does not preempt"])
    assert plan.next_wakeup is not None and abs(plan.next_wakeup - 100) < 1e-3
