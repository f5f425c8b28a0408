"""Gang-aware preemption: the victim search (:mod:`.search`), who may be preempted and in which
order (:mod:`.candidates`), and releasing them until the job fits (:mod:`.release`). Who may
take GPUs from whom is data (``preemption.rights``, :mod:`aicluster.scheduler.rights`).

Why preemption settles (with nothing arriving, nothing finishing and the clock stopped). Give
each running job the key (standing, priority, policy rank): standing 1 in quota, 0 borrowed
(:mod:`~aicluster.scheduler.rights`); the policy rank is fixed while the clock stands (Tiresias:
minus its queue, the one it waits in; SRTF: minus its remaining time). Measure a state by the
multiset of its running jobs' keys, ordered as multisets are (Dershowitz-Manna). Every decision
raises it strictly:

- an admission without victims adds a key; the job starts last, so no other job's standing falls;
- an admission with victims removes theirs and adds the preemptor's, which is above each:
  reclaim: an in-quota job takes borrowed ones; priority: the same standing or better and a
  higher priority (a borrower takes borrowed jobs only); the policy's right: the same standing
  or better, a priority no lower (the policy's right reaches no job of a higher priority) and a
  better policy rank (``may_preempt``). Jobs that stop only raise the standing of jobs started
  after them, in their tenant.

A waiting job's key is the one it will run with (a preemptor within quota counting itself is in
quota once started), keys come from a finite set and the running jobs are bounded by the GPUs,
so no state comes back and the cycles reach a fixed point. Any rights with ``by_standing`` keep
the argument (each only narrows the three above), and so do the protections against thrashing
(:mod:`aicluster.scheduler.protection`: a minimum run time, a cool-down after a preemption):
they only remove victims, so every preemption left still raises the measure, and with the clock
stopped the protected runs stay the same. The legacy rights break it twice:
a borrower's priority took in-quota jobs, which reclaim took back (the cycle of
``tests/unit/test_scheduler_reclaim_cycle.py``), and the policy's right took jobs of higher
priority, which took their GPUs back by priority. The checker ``tests/cycles.py`` searches for
states that come back.

A borrower keeps its priority and policy rights over its own tenant's borrowed jobs (Kueue's
``borrowWithinCohort: Never`` by default; ``max_priority_threshold`` opens other tenants'
borrowed jobs up to a priority). Taking another tenant's in-quota job would let that tenant
reclaim it at once, as in the cycle above.
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
