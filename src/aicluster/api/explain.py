"""Words for the scheduler's placement score, shared by the dashboard and ``aicluster why``."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["LEVELS", "SCORE_TERMS", "explain_score"]

LEVELS = ("NVLink domain", "node", "rack", "pod", "cluster")

#: Each term of ``Placement.score``: what it measures and which way is better.
SCORE_TERMS = {
    "level": "topology level the gang spans (0 NVLink domain … 4 cluster); lower is tighter",
    "nodes": "nodes the gang uses; fewer means less cross-node traffic",
    "powered_nodes": "chosen nodes already powered on; more avoids waking idle nodes",
    "free_left_on_nodes": "GPUs left free on the chosen nodes; fewer is a tighter best fit",
}


def explain_score(score: Mapping[str, float]) -> list[tuple[str, float, str]]:
    """(term, value, meaning) for each term, known terms first in a fixed order."""
    known = [(k, float(score[k]), v) for k, v in SCORE_TERMS.items() if k in score]
    other = [(k, float(v), "") for k, v in score.items() if k not in SCORE_TERMS]
    return known + other
