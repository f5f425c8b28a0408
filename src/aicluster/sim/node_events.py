"""A node's events in a replay: its failure (drawn by the failure model,
:mod:`aicluster.sim.failures`, or injected) and its repair. A failure stops the jobs on the node,
which keep only their last checkpoint (:func:`aicluster.sim.job_events.stop`), and takes the
node's GPUs away until the repair, ``repair_seconds`` later. Each drawn failure draws the next
one; an injected one draws none, so injecting leaves the model's own draws as they were.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aicluster.scheduler import effects
from aicluster.sim import job_events
from aicluster.sim.events import FAIL, INJECTED, REPAIR

if TYPE_CHECKING:
    from aicluster.sim.engine import Simulator

__all__ = ["fail", "repair", "schedule_failure"]


def schedule_failure(sim: Simulator, now: float) -> None:
    """Push the failure model's next failure after ``now`` (none with failures off)."""
    if sim.failures is not None:
        drawn = sim.failures.next_failure(now)
        if drawn is not None:
            sim.events.push(drawn[0], FAIL, drawn[1])


def fail(sim: Simulator, node: str, now: float, token: int) -> None:
    if token != INJECTED:
        schedule_failure(sim, now)
    if node in sim.down:
        return  # already down: thinning keeps each up node's own failure rate
    sim.totals.failures += 1
    sim.down.add(node)
    sim.down_gpus += sim.node_gpus[node]
    for job_id in effects.node_down(sim.state, node, now):
        job_events.stop(sim, job_id, now, preempted=False)
    sim.events.push(now + sim.config.repair_seconds, REPAIR, node)


def repair(sim: Simulator, node: str, now: float) -> None:
    sim.down.discard(node)
    sim.down_gpus -= sim.node_gpus[node]
    effects.node_up(sim.state, node, now)
    sim.dirty = True
