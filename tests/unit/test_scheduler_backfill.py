"""Backfill: EASY reservations for the blocked head and who may pass it. One table of named
cases: add a row."""

import pytest

from aicluster.core import PendingCode
from builders import Case, Occupied, check, make_job, small_cluster

BACKFILL = {
    "backfill never delays the reserved head": Case(
        # Two nodes: "wide" (8 GPUs, ends at 100) and "half" (4 GPUs, ends at 50) run.
        cluster=small_cluster(nodes=2, per_rack=2),
        running=(Occupied("wide", "node-0", 8, estimate=100), Occupied("half", "node-1", 4, 50)),
        submit=(
            make_job("head").gpus(16).at(1),  # needs both nodes: reserved from t=100
            make_job("slow").gpus(4).at(2).estimate(200),  # would end at 200 > 100: waits
            make_job("quick").gpus(4).at(3).estimate(60),  # ends at 60 <= 100: may backfill
            make_job("unknown").gpus(2).at(2.5),  # no estimate: may not touch reserved nodes
        ),
        admits=("quick",),
        backfilled=("quick",),
        waits={
            "slow": PendingCode.RESERVATION,
            "unknown": PendingCode.RESERVATION,
        },
        says={
            "head": "head of the queue",
            "slow": "expected at t=100",
            "unknown": "no duration estimate",
        },
    ),
    "backfill uses capacity outside the reservation": Case(
        # Three nodes in one rack; the head needs two whole nodes, the third is free to use.
        cluster=small_cluster(nodes=3, per_rack=3),
        running=(
            Occupied("x", "node-0", 4),
            Occupied("y", "node-1", 4),
            Occupied("z", "node-2", 6),
        ),
        submit=(make_job("head").gpus(16).at(1), make_job("small").gpus(2).at(2)),
        admits=("small",),
        backfilled=("small",),
        on={"small": ("node-2",)},
    ),
    "without backfill nothing passes a blocked head": Case(
        config={"backfill": "none"},
        running=(Occupied("busy", "node-0", 4),),
        submit=(make_job("head").gpus(8).at(1), make_job("small").gpus(1).at(2)),
        admits=(),
        waits={"small": PendingCode.QUEUE_ORDER},
    ),
}


@pytest.mark.parametrize("case", BACKFILL.values(), ids=BACKFILL.keys())
def test_backfill(case: Case) -> None:
    check(case)
