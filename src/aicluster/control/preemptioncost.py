"""The live cluster's cost of preemption (:mod:`aicluster.core.preemption_cost`), read from the
store's job transitions into one :class:`~aicluster.core.preemption_cost.CostLedger`, each event
once: ``/metrics``, ``GET /v1/cluster`` (``aicluster status``) and the dashboard show it."""

from __future__ import annotations

import threading

from aicluster.core.preemption_cost import CostLedger, PreemptionCost
from aicluster.store import Store

__all__ = ["PreemptionTally"]


class PreemptionTally:
    """Per tenant, the preemptions, lost work and admitted time since the store began."""

    def __init__(self) -> None:
        self._ledger = CostLedger()
        self._last_id: int | None = None
        self._lock = threading.Lock()  # scrapes and API calls read it from several threads

    def read(self, store: Store, now: float) -> dict[str, PreemptionCost]:
        """Each tenant's cost as of ``now``, after the transitions logged since the last read."""
        with self._lock:
            while batch := store.job_transitions(after_id=self._last_id):
                for event, gpus in batch:
                    self._ledger.transition(
                        event.job_id or "",
                        event.tenant or "",
                        gpus,
                        event.at,
                        event.to_state or "",
                        event.details,
                    )
                self._last_id = batch[-1][0].id
            return self._ledger.costs(now)
