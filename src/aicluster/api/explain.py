"""Words for the scheduler's placement score and a job's stragglers, shared by the dashboard,
``aicluster why`` and ``aicluster jobs``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from aicluster.store import EventRecord

__all__ = ["LEVELS", "SCORE_TERMS", "explain_score", "straggler_note"]

LEVELS = ("NVLink domain", "node", "rack", "pod", "cluster")

#: Each term of ``Placement.score``: what it measures and which way is better.
SCORE_TERMS = {
    "level": "topology level the gang spans (0 NVLink domain … 4 cluster); lower is tighter",
    "nodes": "nodes the gang uses; fewer means less cross-node traffic",
    "powered_nodes": "chosen nodes already powered on; more avoids waking idle nodes",
    "free_left_on_nodes": "GPUs left free on the chosen nodes; fewer is a tighter best fit",
    "data_cached_bytes": "bytes of the job's input data already cached on the chosen nodes; "
    "more moves less (breaks ties among otherwise equal placements)",
}


def explain_score(score: Mapping[str, float]) -> list[tuple[str, float, str]]:
    """(term, value, meaning) for each term, known terms first in a fixed order."""
    known = [(k, float(score[k]), v) for k, v in SCORE_TERMS.items() if k in score]
    other = [(k, float(v), "") for k, v in score.items() if k not in SCORE_TERMS]
    return known + other


def straggler_note(events: Iterable[EventRecord]) -> str | None:
    """The stragglers flagged in the job's latest attempt (``job.straggler`` events since its
    latest start), in words; None when there are none."""
    flagged: dict[int, str] = {}
    for event in events:
        if event.to_state == "STARTING":
            flagged.clear()
        if event.kind != "job.straggler":
            continue
        details = event.details
        rank = details.get("rank")
        if isinstance(rank, bool) or not isinstance(rank, int):
            continue
        node, ratio, step = details.get("node"), details.get("ratio"), details.get("step")
        text = f"rank {rank}" + (f" on {node}" if isinstance(node, str) and node else "")
        if isinstance(ratio, int | float) and math.isfinite(ratio):
            text += f" is {ratio:.2f}x slower than the median"
        if isinstance(step, int) and not isinstance(step, bool):
            text += f" (flagged at step {step})"
        flagged[rank] = text
    return "straggler: " + "; ".join(flagged[r] for r in sorted(flagged)) if flagged else None
