"""The live cluster's cost of preemption (:mod:`aicluster.core.preemption_cost`), read from the
store's job transitions into one :class:`~aicluster.core.preemption_cost.CostLedger`, each event
once: ``/metrics``, ``GET /v1/cluster`` (``aicluster status``) and the dashboard show it."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from aicluster.core.preemption_cost import KINDS, CostLedger, PreemptionCost
from aicluster.store import Store

__all__ = ["PreemptionTally", "preemption_families"]


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


def preemption_families(
    tenants: Iterable[str], costs: Mapping[str, PreemptionCost]
) -> Iterator[Metric]:
    """The cost of preemption per tenant (:mod:`aicluster.core.preemption_cost`); every tenant
    and kind has its series from the start (at 0), so ``increase()`` sees the first one."""
    count = CounterMetricFamily(
        "aicluster_preemptions",
        "Preemptions of the tenant's jobs (runs stopped and requeued), by kind: reclaim, "
        "priority, policy, drain, elastic (or unknown).",
        labels=["tenant", "kind"],
    )
    lost = CounterMetricFamily(
        "aicluster_preemption_lost_gpu_seconds",
        "GPU-seconds of work the tenant's preempted runs did since their last save, by kind.",
        labels=["tenant", "kind"],
    )
    admitted = CounterMetricFamily(
        "aicluster_admitted_gpu_seconds",
        "GPU-seconds the tenant's runs held, from their admission (STARTING) to their end.",
        labels=["tenant"],
    )
    ratio = GaugeMetricFamily(
        "aicluster_evictions_per_admitted_gpu_hour",
        "The tenant's preemptions per admitted GPU-hour.",
        labels=["tenant"],
    )
    for tenant in sorted(set(tenants) | set(costs)):
        cost = costs.get(tenant, PreemptionCost())
        for kind in sorted(set(KINDS) | set(cost.by_kind)):
            count.add_metric([tenant, kind], cost.by_kind.get(kind, 0))
            lost.add_metric([tenant, kind], cost.lost_by_kind.get(kind, 0.0))
        admitted.add_metric([tenant], cost.admitted_gpu_seconds)
        ratio.add_metric([tenant], cost.evictions_per_gpu_hour)
    yield from (count, lost, admitted, ratio)
