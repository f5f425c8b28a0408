"""The cost of preemption (core.preemption_cost): the ledger the live cluster reads its job
transitions into, and the simulator's figures on a hand-worked replay, which the same
transitions fed to the ledger give again (one definition on both sides)."""

from __future__ import annotations

from typing import Any

import pytest

from aicluster.core import make_cluster
from aicluster.core.preemption_cost import CostLedger, PreemptionCost, total
from aicluster.sim import SimConfig, TraceJob, preemption_summary, simulate, summarize

QUIET = SimConfig(failures=False, restart_overhead=60.0, checkpoint_interval=300.0)

#: (job, tenant, GPUs, at, to_state, details): a job of tenant a preempted for b's by
#: priority, back in the queue with 40 GPU-seconds lost, admitted again and still running.
HISTORY: list[tuple[str, str, int, float, str, dict[str, Any]]] = [
    ("j1", "a", 8, 0.0, "STARTING", {}),
    ("j1", "a", 8, 5.0, "RUNNING", {}),
    ("j1", "a", 8, 100.0, "PREEMPTING", {"kind": "priority"}),
    ("j2", "b", 4, 100.0, "STARTING", {}),
    ("j1", "a", 8, 103.0, "PENDING", {"lost_gpu_seconds": 40.0}),
    ("j2", "b", 4, 200.0, "SUCCEEDED", {}),
    ("j1", "a", 8, 200.0, "STARTING", {}),
]


def ledger_of(history: list[tuple[str, str, int, float, str, dict[str, Any]]]) -> CostLedger:
    ledger = CostLedger()
    for event in history:
        ledger.transition(*event)
    return ledger


def test_the_ledger_counts_preemptions_by_kind_lost_work_and_admitted_time() -> None:
    costs = ledger_of(HISTORY).costs(now=300.0)
    a, b = costs["a"], costs["b"]
    assert (a.preemptions, a.by_kind, a.lost_gpu_seconds) == (1, {"priority": 1}, 40.0)
    # Admitted from STARTING until the scheduler took the GPUs back (PREEMPTING), and the
    # second run up to now.
    assert a.admitted_gpu_seconds == 8 * 100 + 8 * 100
    assert b.admitted_gpu_seconds == 4 * 100 and b.preemptions == 0
    assert a.evictions_per_gpu_hour == pytest.approx(1 / (1600 / 3600))
    assert b.evictions_per_gpu_hour == 0.0


def test_the_ledger_reads_incrementally_and_leaves_its_own_totals_alone() -> None:
    ledger = ledger_of(HISTORY[:4])
    assert ledger.costs(now=150.0)["a"].preemptions == 0  # not back in the queue yet
    for event in HISTORY[4:]:
        ledger.transition(*event)
    first = ledger.costs(now=300.0)["a"].admitted_gpu_seconds
    assert ledger.costs(now=400.0)["a"].admitted_gpu_seconds == first + 8 * 100
    assert ledger.tenants["a"].admitted_gpu_seconds == 8 * 100  # open runs are not added in


def test_a_job_cancelled_while_preempted_is_no_preemption_and_bad_records_lose_nothing() -> None:
    history = [
        ("j1", "a", 8, 0.0, "STARTING", {}),
        ("j1", "a", 8, 10.0, "PREEMPTING", {"kind": "reclaim"}),
        ("j1", "a", 8, 12.0, "CANCELLED", {"lost_gpu_seconds": 80.0}),
        ("j2", "a", 8, 20.0, "STARTING", {}),
        ("j2", "a", 8, 30.0, "PREEMPTING", {}),  # a kind not recorded
        ("j2", "a", 8, 31.0, "PENDING", {"lost_gpu_seconds": "a lot"}),
    ]
    cost = ledger_of(history).costs(now=100.0)["a"]
    assert (cost.preemptions, cost.by_kind, cost.lost_gpu_seconds) == (1, {"unknown": 1}, 0.0)
    assert cost.admitted_gpu_seconds == 8 * 10 + 8 * 10


def test_total_adds_tenants_up() -> None:
    a, b = PreemptionCost(), PreemptionCost(admitted_gpu_seconds=3600.0)
    a.evicted("reclaim", 7200.0)
    b.evicted("policy", 0.0)
    whole = total([a, b]).figures()
    assert whole["by_kind"] == {"policy": 1, "reclaim": 1}
    assert whole["lost_gpu_hours"] == 2.0 and whole["evictions_per_gpu_hour"] == 2.0
    assert a.by_kind == {"reclaim": 1}  # the parts are left as they were


def test_the_simulator_and_the_ledger_give_the_same_figures() -> None:
    """Tenant a's long job drops to Tiresias' second queue after 3,600 GPU-seconds; b's short
    one arrives at 1,000 s and takes its GPUs by the policy's right. Checkpoints every 300 s
    keep 900 s: 100 s x 8 GPUs are lost. The live loop would log the same runs as these
    transitions, and the ledger reads the same figures from them."""
    trace = [TraceJob("long", 0, 10_000, 8, "a"), TraceJob("short", 1_000, 100, 8, "b")]
    result = simulate(make_cluster(nodes=1), trace, "tiresias", config=QUIET)
    figures = preemption_summary(result)
    assert figures["preemptions_by_kind"] == {"policy": 1}
    assert figures["lost_gpu_hours_by_kind"] == {"policy": pytest.approx(800 / 3600)}
    summary = summarize(result)
    assert figures["evictions_per_gpu_hour"] == pytest.approx(
        summary["preemptions"] / (result.totals.allocated / 3600)
    )
    end = 1_100 + 60 + 9_100  # resumed after short, restores 60 s, does the 9,100 s left
    live = ledger_of(
        [
            ("long", "a", 8, 0.0, "STARTING", {}),
            ("long", "a", 8, 1_000.0, "PREEMPTING", {"kind": "policy"}),
            ("short", "b", 8, 1_000.0, "STARTING", {}),
            ("long", "a", 8, 1_000.0, "PENDING", {"lost_gpu_seconds": 800.0}),
            ("short", "b", 8, 1_100.0, "SUCCEEDED", {}),
            ("long", "a", 8, 1_100.0, "STARTING", {}),
            ("long", "a", 8, end, "SUCCEEDED", {}),
        ]
    ).costs(now=end)
    simulated = figures["preemption_cost"]
    assert set(simulated) == set(live) == {"a", "b"}
    for tenant, cost in live.items():
        expected = cost.figures()
        assert simulated[tenant].pop("by_kind") == expected.pop("by_kind")
        lost = simulated[tenant].pop("lost_gpu_hours_by_kind")
        assert lost == pytest.approx(expected.pop("lost_gpu_hours_by_kind"))
        assert simulated[tenant] == pytest.approx(expected), tenant
