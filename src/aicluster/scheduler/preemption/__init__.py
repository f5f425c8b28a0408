"""Gang-aware preemption: the victim search (:mod:`.search`), who may be preempted and in which
order (:mod:`.candidates`), and releasing them until the job fits (:mod:`.release`).
"""

from aicluster.scheduler.preemption.candidates import (
    CandidateKinds,
    CandidateMemo,
    PreemptionContext,
)
from aicluster.scheduler.preemption.search import find_victims, preemption_possible

__all__ = [
    "CandidateKinds",
    "CandidateMemo",
    "PreemptionContext",
    "find_victims",
    "preemption_possible",
]
