"""The dashboard's pure views: the cluster map's scoping and the job page's training summary."""

from __future__ import annotations

import json
import math

from aicluster.api.clustermap import HIDDEN, ClusterMapOut, cluster_map
from aicluster.api.jobview import MAX_BUCKETS, MAX_POINTS, timeline, training
from aicluster.core import JobState, Node
from aicluster.store import EventRecord, NodeHealth, NodeRecord, PlacedJob, Principal, Role


def _node(name: str, rack: str, health: NodeHealth = NodeHealth.HEALTHY) -> NodeRecord:
    return NodeRecord(Node(name, 8, "H100", rack, "pod-0"), health, 0.0, None, None)


def _placed(job_id: str, tenant: str, slots: list[list[object]]) -> PlacedJob:
    gpus = sum(n for slot in slots if isinstance(n := slot[1], int))
    placement = {"level": "node", "domain": "x", "slots": slots, "score": {}}
    return PlacedJob(job_id, tenant, f"{tenant}-secret", JobState.RUNNING, 0, gpus, placement)


def test_the_map_hides_other_tenants_jobs() -> None:
    nodes = [_node("n0", "r0"), _node("n1", "r1", NodeHealth.CORDONED)]
    placed = [
        _placed("j-a", "a", [["n0", 4, 0]]),
        _placed("j-b", "b", [["n0", 2, 1], ["n1", 8, 0]]),
        _placed("j-malformed", "a", [["n0", "x", 0]]),  # a malformed slot shows nothing
    ]
    alice = Principal("alice", {"a": Role.VIEWER})
    answer = cluster_map(nodes, placed, alice, {"running": 3, "pending": 1})
    text = json.dumps(answer)
    assert 'j-b"' not in text and "b-secret" not in text and '"b"' not in text
    parsed = ClusterMapOut.model_validate(answer)
    assert [job.id for job in parsed.jobs] == ["j-a", "j-malformed"]
    n0, n1 = (rack.nodes[0] for rack in parsed.pods[0].racks)
    assert n0.slots == [(0, 4), (HIDDEN, 2)] and n1.slots == [(HIDDEN, 8)]
    assert n1.health == "cordoned" and (parsed.gpus, parsed.busy) == (16, 14)
    admin = ClusterMapOut.model_validate(cluster_map(nodes, placed, Principal("op", {}, True)))
    assert {job.tenant for job in admin.jobs} == {"a", "b"}


def _records(rank: int, steps: int, slow_after: int | None = None) -> list[dict[str, object]]:
    records: list[dict[str, object]] = [{"kind": "start", "rank": rank, "time": 0.0}]
    for step in range(1, steps + 1):
        slow = slow_after is not None and step > slow_after
        records.append(
            {
                "kind": "step",
                "rank": rank,
                "time": float(step),
                "step": step,
                "loss": 1.0 / step,
                "step_time": 0.3 if slow else 0.1,
                "throughput": 10.0,
            }
        )
        if step % 100 == 0:
            records.append({"kind": "checkpoint", "rank": rank, "time": float(step), "step": step})
    return records


def test_training_is_bounded_and_marks_the_slow_rank() -> None:
    summary = training({"0": _records(0, 1000), "1": _records(1, 1000, slow_after=500)}, 2)
    assert len(summary.loss) == MAX_POINTS and summary.loss[-1] == (1000, 0.001)
    heatmap = summary.heatmap
    assert heatmap.ranks == [0, 1] and len(heatmap.steps) <= MAX_BUCKETS
    slow_ranks = {rank for rank, _ in heatmap.slow}
    assert slow_ranks == {1}
    late = len(heatmap.steps) - 1
    assert [1, late] in heatmap.slow and [1, 0] not in heatmap.slow
    assert [c["step"] for c in summary.checkpoints] == [100 * n for n in range(1, 11)]
    assert summary.last_step == 1000 and summary.throughput == 20.0


def test_training_skips_what_user_code_got_wrong() -> None:
    bad = [
        {"kind": "step", "rank": 0, "step": "<img>", "loss": 1.0},
        {"kind": "step", "rank": 0, "step": 1, "loss": math.nan, "step_time": math.inf},
        {"kind": "step", "rank": 0, "step": 2, "loss": "high", "step_time": 0.1},
        {"kind": "checkpoint", "rank": 0, "step": None},
    ]
    summary = training({"0": bad, "junk": bad}, 1)
    assert summary.loss == [] and summary.checkpoints == []
    assert summary.heatmap.seconds == [[None, 0.1]]
    json.loads(summary.model_dump_json())  # no NaN reaches JSON


def test_timeline_lists_state_changes_only() -> None:
    events = [
        EventRecord(1, 1.0, "alice", "job.submitted", "a", "j", None, "PENDING", {}),
        EventRecord(2, 2.0, "loop", "job.straggler", "a", "j", None, None, {"rank": 1}),
        EventRecord(3, 3.0, "loop", "job.state", "a", "j", "PENDING", "STARTING", {"reason": "r"}),
    ]
    assert [(t.state, t.reason) for t in timeline(events)] == [("PENDING", None), ("STARTING", "r")]
