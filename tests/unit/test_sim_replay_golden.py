"""A fixed small Philly replay gives exactly the decisions recorded before the speed work.

The digests were taken from the simulator before its hot paths were optimised (commit 26fc170):
any change to a start, an end, a restart count or a summary figure changes them. Failures are
made frequent and, in the quota cases, every 7th job is high priority, so failure requeues,
Tiresias demotions, priority and reclaim preemptions (one-node and multi-node gangs) all occur.
They are taken with the protections against thrashing off (``min_runtime_s`` and ``cooldown_s``
0, Tiresias' ``promote_backoff`` 1: the decisions before issue 34); ``PROTECTED`` pins the same
replays with the defaults.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import pytest

from aicluster.core import NodeShape, Tenant, make_cluster
from aicluster.scheduler import SchedulerConfig
from aicluster.sim import SimConfig, TraceJob, load_philly, simulate, summarize

GOLDEN = [
    ("fifo", False, 1200, "30659cd0b2b62034cfa4191c665c29afbd2ff0bf5d347ea794e3f983569e5361"),
    ("sjf", False, 1200, "472ff3897c2fc768ce0e29431e5d27d68d9fe1a4d5357c40eb77d894b3f0e6e1"),
    ("fair", False, 1200, "f084355cc3f1e37f84779616bf84db175f5a6e26357470d1584ee05372678ab7"),
    ("tiresias", False, 250, "125e55305cc7ef01fc8881e2f7bd34e5f7ece94a24617512672b4b552cfc1d39"),
    ("fifo", True, 400, "bc758fb5694d2de3f024b9799f30797b909359304bd4937268354ffb7195189f"),
    ("fair", True, 400, "d11478e83283777126352ceaeb0c01227d70cb11966c6aa4eaa20df97fdd90a7"),
]
#: The same replays with the protections' defaults (the replays that preempt change; Tiresias'
#: again with its promotion backoff: 741 preemptions, 869 with a constant wait).
PROTECTED = [
    ("tiresias", False, 250, "5e8a82488e3fd21259a3e1e61b1b21219c94837b67c973efd76f8eb7e35e3930"),
    ("fifo", True, 400, "0440db10a87de0139d8d3fe1d3921dfc50bcc8172a11eac1bab2e92255167f9b"),
    ("fair", True, 400, "f2554486f718c60e457df77d36f1a4b9d0035822a8315433ea546bb4f370c20d"),
]
UNPROTECTED = SchedulerConfig(min_runtime_s=0, cooldown_s=0, tiresias_promote_backoff=1)
TENANTS = {
    "6214e9": Tenant("6214e9", {"V100": 32}, {"V100": 16}),
    "11cb48": Tenant("11cb48", {"V100": 16}, {"V100": 32}),
    "103959": Tenant("103959", {"V100": 8}, weight=2.0),
}


@pytest.fixture(scope="module")
def philly() -> list[TraceJob]:
    return load_philly()[:1200]


def replay_digest(
    trace: list[TraceJob], policy: str, quotas: bool, protected: bool = False
) -> tuple[str, dict[str, Any]]:
    cluster = make_cluster(
        nodes=8, nodes_per_rack=2, racks_per_pod=2, shape=NodeShape(gpu_type="V100")
    )
    tenants = None
    if quotas:
        trace = [replace(j, priority=300) if i % 7 == 3 else j for i, j in enumerate(trace)]
        tenants = TENANTS
    config = SimConfig(gpu_hours_per_failure=3000.0, seed=1)
    scheduler = SchedulerConfig() if protected else UNPROTECTED
    result = simulate(cluster, trace, policy, tenants=tenants, config=config, scheduler=scheduler)
    summary = summarize(result)
    summary.pop("wall_seconds")
    summary.pop("jobs_per_second")
    table = result.jobs
    text = repr((sorted(summary.items()), list(table.start), list(table.end), list(table.restarts)))
    return hashlib.sha256(text.encode()).hexdigest(), summary


@pytest.mark.parametrize(("policy", "quotas", "jobs", "expected"), GOLDEN)
def test_a_fixed_replay_makes_the_recorded_decisions(
    philly: list[TraceJob], policy: str, quotas: bool, jobs: int, expected: str
) -> None:
    digest, summary = replay_digest(philly[:jobs], policy, quotas)
    assert summary["completed"] == jobs and summary["failures"] > 0
    if policy == "tiresias" or quotas:
        assert summary["preemptions"] > 0
    assert digest == expected


@pytest.mark.parametrize(("policy", "quotas", "jobs", "expected"), PROTECTED)
def test_a_fixed_replay_with_the_protections_makes_the_recorded_decisions(
    philly: list[TraceJob], policy: str, quotas: bool, jobs: int, expected: str
) -> None:
    digest, summary = replay_digest(philly[:jobs], policy, quotas, protected=True)
    assert summary["completed"] == jobs
    assert digest == expected
