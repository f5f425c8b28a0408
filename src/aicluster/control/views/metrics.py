"""Prometheus metrics of the control plane, read from its state when scraped.

Gauges are not kept up to date event by event: :class:`PlaneCollector` asks the store, the queue
and the scheduler's usage at scrape time (one GROUP BY, a copy of the published queue), so they
can never drift from what the API shows. Two things are observed as they happen and kept per
process: the scheduling cycle's latency (:func:`observe_cycle`, called by the control loop) and
serving requests (:data:`SERVING`, called by the serving layer; see
:mod:`aicluster.control.views.servingmetrics`).

Every per-tenant series carries a ``tenant`` label; the API uses it to show a caller only the
series of its own tenants (see :mod:`aicluster.api.metrics`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from aicluster.control.views.powerview import budget_families, rack_power
from aicluster.control.views.preemptioncost import preemption_families
from aicluster.control.views.servingmetrics import SERVING, ServingMetrics
from aicluster.core import JobState
from aicluster.store import NodeHealth

__all__ = [
    "CYCLE_SECONDS",
    "PER_TENANT_FAMILIES",
    "SERVING",
    "PlaneCollector",
    "ServingMetrics",
    "observe_cycle",
]

#: Scheduling cycles take microseconds on a small cluster and up to seconds on a huge queue.
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

CYCLE_SECONDS = Histogram(
    "aicluster_scheduling_cycle_seconds",
    "Time of one scheduling cycle (schedule(snapshot) -> Plan).",
    buckets=CYCLE_BUCKETS,
    registry=None,  # exported by PlaneCollector, not by a global registry
)


def observe_cycle(seconds: float) -> None:
    """Record one scheduling cycle's duration (the control loop's only metrics hook)."""
    CYCLE_SECONDS.observe(seconds)


@dataclass
class _GoodputTotals:
    """Sums over the ``job.goodput`` events of finished jobs, per tenant."""

    productive: float = 0.0
    wall: float = 0.0
    lost: float = 0.0
    restart: float = 0.0
    jobs: int = 0


@dataclass
class _EventTally:
    """Incremental sums over the event log: read from the last event id seen, never twice."""

    last_id: int | None = None
    goodput: dict[str, _GoodputTotals] = field(default_factory=dict)
    observations: dict[tuple[str, str], int] = field(default_factory=dict)
    alarms: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, alarm)
    data: dict[tuple[str, str], float] = field(default_factory=dict)  # (tenant, figure)


_TALLIED = (
    "job.goodput",
    "job.data",
    "job.straggler",
    "job.hung",
    "job.output_rejected",
    "job.handling_failed",
    "security.alarm",
)

#: The data figures of ended attempts (``job.data`` events), summed per tenant.
_DATA_FIGURES = (
    ("cache_hits", "Dataset shards the nodes' caches served to the tenant's jobs."),
    ("shards_fetched", "Dataset shards the nodes fetched from the data store for its jobs."),
    ("bytes_fetched", "Bytes of dataset shards the nodes fetched for the tenant's jobs."),
    ("wait_seconds", "Seconds the tenant's ranks waited for their datasets, summed."),
)

#: Families whose every series has a ``tenant`` label: what a tenant's token may read.
PER_TENANT_FAMILIES = frozenset(
    {
        "aicluster_jobs",
        "aicluster_job_restarts",
        "aicluster_job_observations",
        "aicluster_queue_jobs",
        "aicluster_queue_gpus",
        "aicluster_queue_wait_seconds_max",
        "aicluster_queue_wait_seconds_mean",
        "aicluster_gpus_allocated",
        "aicluster_gpus_quota",
        "aicluster_gpus_borrowed",
        "aicluster_goodput_productive_seconds",
        "aicluster_goodput_wall_seconds",
        "aicluster_goodput_lost_seconds",
        "aicluster_goodput_restart_seconds",
        "aicluster_goodput_ettr",
        "aicluster_serving_requests",
        "aicluster_serving_responses",
        "aicluster_serving_errors",
        "aicluster_serving_request_seconds",
        "aicluster_serving_traffic_weight",
        "aicluster_model_drift_score",
        "aicluster_job_sync_jitter_seconds",
        "aicluster_node_sync_jitter_seconds",
        "aicluster_job_straggler_ratio",
        "aicluster_security_alarms",
        "aicluster_preemptions",
        "aicluster_preemption_lost_gpu_seconds",
        "aicluster_admitted_gpu_seconds",
        "aicluster_evictions_per_admitted_gpu_hour",
        *(f"aicluster_data_{name}" for name, _ in _DATA_FIGURES),
    }
)


class PlaneCollector:
    """Metric families of a control plane (``aicluster.control.ControlPlane`` or one of its
    shape), computed from its state when :meth:`collect` is called."""

    def __init__(self, plane: Any, extra: Iterable[Any] = ()) -> None:
        self.plane = plane
        self.extra = list(extra)  # more collectors (the API's latency histogram)
        self._tally = _EventTally()
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        tenants = self.plane.store.list_tenants()
        yield from self._jobs([t.name for t in tenants])
        yield from self._queue()
        yield from self._gpus(tenants)
        yield from self._nodes()
        yield from self._power()
        yield from self._events()
        yield from preemption_families([t.name for t in tenants], self.plane.preemption_cost())
        yield from self._loop()
        yield from _jitter(self.plane.loop)
        yield from SERVING.collect()
        drift = getattr(self.plane, "drift", None)
        if drift is not None:
            yield from drift.collect()
        for collector in self.extra:
            yield from collector.collect()

    def _jobs(self, tenants: list[str]) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "aicluster_jobs", "Jobs by state and tenant.", labels=["tenant", "state"]
        )
        restarts = CounterMetricFamily(
            "aicluster_job_restarts",
            "Restarts of the tenant's jobs (entries into RESTARTING).",
            labels=["tenant"],
        )
        counts = {(c.tenant, c.state): c for c in self.plane.store.job_counts()}
        for tenant in sorted(set(tenants) | {tenant for tenant, _ in counts}):
            total = 0
            for state in JobState:
                found = counts.get((tenant, state))
                jobs.add_metric([tenant, state.value], found.jobs if found else 0)
                total += found.restarts if found else 0
            restarts.add_metric([tenant], total)
        yield jobs
        yield restarts

    def _queue(self) -> Iterator[Metric]:
        length = GaugeMetricFamily(
            "aicluster_queue_jobs", "Pending jobs in the queue.", labels=["tenant"]
        )
        gpus = GaugeMetricFamily(
            "aicluster_queue_gpus", "GPUs the tenant's pending jobs ask for.", labels=["tenant"]
        )
        oldest = GaugeMetricFamily(
            "aicluster_queue_wait_seconds_max",
            "Longest current wait in the queue.",
            labels=["tenant"],
        )
        mean = GaugeMetricFamily(
            "aicluster_queue_wait_seconds_mean",
            "Mean current wait in the queue.",
            labels=["tenant"],
        )
        waits: dict[str, list[float]] = {}
        asked: dict[str, int] = {}
        for entry in self.plane.queue():
            waits.setdefault(entry.tenant, []).append(entry.waiting_seconds)
            asked[entry.tenant] = asked.get(entry.tenant, 0) + entry.gpus
        for tenant, seconds in sorted(waits.items()):
            length.add_metric([tenant], len(seconds))
            gpus.add_metric([tenant], asked[tenant])
            oldest.add_metric([tenant], max(seconds))
            mean.add_metric([tenant], sum(seconds) / len(seconds))
        yield from (length, gpus, oldest, mean)

    def _gpus(self, tenants: Iterable[Any]) -> Iterator[Metric]:
        labels = ["tenant", "gpu_type"]
        allocated = GaugeMetricFamily(
            "aicluster_gpus_allocated", "GPUs held by the tenant's jobs.", labels=labels
        )
        quota = GaugeMetricFamily("aicluster_gpus_quota", "The tenant's quota.", labels=labels)
        borrowed = GaugeMetricFamily(
            "aicluster_gpus_borrowed",
            "GPUs held beyond the tenant's quota (borrowed from idle quota).",
            labels=labels,
        )
        usage = self.plane.usage_by_tenant()
        for tenant in tenants:
            used = usage.get(tenant.name, {})
            for gpu_type in sorted(set(used) | set(tenant.quota)):
                held, owned = used.get(gpu_type, 0), tenant.quota.get(gpu_type, 0)
                allocated.add_metric([tenant.name, gpu_type], held)
                quota.add_metric([tenant.name, gpu_type], owned)
                borrowed.add_metric([tenant.name, gpu_type], max(0, held - owned))
        yield from (allocated, quota, borrowed)

    def _nodes(self) -> Iterator[Metric]:
        capacity = GaugeMetricFamily(
            "aicluster_gpus_capacity", "GPUs registered, by type.", labels=["gpu_type"]
        )
        nodes = GaugeMetricFamily("aicluster_nodes", "Nodes by health.", labels=["health"])
        gpus: dict[str, int] = {}
        health = dict.fromkeys((h.value for h in NodeHealth), 0)
        for record in self.plane.store.list_nodes():
            gpus[record.node.gpu_type] = gpus.get(record.node.gpu_type, 0) + record.node.gpus
            health[record.health.value] += 1
        for gpu_type, total in sorted(gpus.items()):
            capacity.add_metric([gpu_type], total)
        for name, count in health.items():
            nodes.add_metric([name], count)
        yield from (capacity, nodes)

    def _power(self) -> Iterator[Metric]:
        """Each node's and rack's draw, labelled measured (its meters: NVML, RAPL) or modelled
        (the cluster file's power model), and the power budgets with their modelled draw."""
        node = GaugeMetricFamily(
            "aicluster_node_power_watts",
            "A node's power draw: measured where its meters report, else the power model's.",
            labels=["node", "rack", "source"],
        )
        rack = GaugeMetricFamily(
            "aicluster_rack_power_watts",
            "A rack's power draw: the sum of its nodes' (source: measured, modelled or partial).",
            labels=["rack", "source"],
        )
        found = self.plane.node_power()
        for each in found:
            node.add_metric([each.node, each.rack, each.source], each.watts)
        for name, (watts, source) in sorted(rack_power(found).items()):
            rack.add_metric([name, source], watts)
        yield from (node, rack)
        yield from budget_families(self.plane.loop)

    def _events(self) -> Iterator[Metric]:
        tally = self._read_events()
        names = ("productive", "wall", "lost", "restart")
        sums = {
            name: CounterMetricFamily(
                f"aicluster_goodput_{name}_seconds",
                f"{name.capitalize()} seconds of the tenant's finished jobs (see ETTR).",
                labels=["tenant"],
            )
            for name in names
        }
        ettr = GaugeMetricFamily(
            "aicluster_goodput_ettr",
            "Effective training time ratio of the tenant's finished jobs: productive / wall.",
            labels=["tenant"],
        )
        observed = CounterMetricFamily(
            "aicluster_job_observations",
            "Stragglers flagged, hangs detected, output records dropped by the reader of job "
            "output, and faults of the control loop's handling, in the tenant's jobs.",
            labels=["tenant", "kind"],
        )
        for tenant, totals in sorted(tally.goodput.items()):
            for name in names:
                sums[name].add_metric([tenant], getattr(totals, name))
            ettr.add_metric([tenant], totals.productive / totals.wall if totals.wall else 0.0)
        for (tenant, kind), count in sorted(tally.observations.items()):
            observed.add_metric([tenant, kind], count)
        yield from (*sums.values(), ettr, observed)
        yield from _data_families(tally)
        yield _alarm_family(tally)

    def _read_events(self) -> _EventTally:
        with self._lock:
            tally = self._tally
            while batch := self.plane.store.events_of_kind(_TALLIED, after_id=tally.last_id):
                for event in batch:
                    _count(tally, event)
                tally.last_id = batch[-1].id
            return _EventTally(
                tally.last_id,
                {t: _GoodputTotals(**vars(g)) for t, g in tally.goodput.items()},
                dict(tally.observations),
                dict(tally.alarms),
                dict(tally.data),
            )

    def _loop(self) -> Iterator[Metric]:
        loop = self.plane.loop
        leader = GaugeMetricFamily("aicluster_leader", "1 while this server runs the control loop.")
        leader.add_metric([], 1 if loop is not None else 0)
        yield leader
        cycles = CounterMetricFamily("aicluster_scheduling_cycles", "Scheduling cycles run.")
        last = GaugeMetricFamily(
            "aicluster_scheduling_last_cycle_seconds", "Duration of the latest cycle."
        )
        cycles.add_metric([], loop.stats.cycles if loop is not None else 0)
        last.add_metric([], loop.stats.last_cycle_seconds if loop is not None else 0.0)
        yield from (cycles, last)
        yield from _loop_health(loop)
        yield from CYCLE_SECONDS.collect()


def _loop_health(loop: Any) -> Iterator[Metric]:
    """The watchdog's and the per-job fault isolation's counts (zero on a standby)."""
    over = CounterMetricFamily(
        "aicluster_control_ticks_over_budget",
        "Control-loop ticks that ran over their budget (reported by the watchdog).",
    )
    running = GaugeMetricFamily(
        "aicluster_control_tick_running_seconds", "How long the current tick has run (0: idle)."
    )
    faults = CounterMetricFamily(
        "aicluster_control_job_faults",
        "Exceptions in the control loop's handling of one job (the tick went on).",
    )
    over.add_metric([], loop.watchdog.over_budget if loop is not None else 0)
    running.add_metric([], loop.watchdog.running_s() if loop is not None else 0.0)
    faults.add_metric([], loop.gangs.faults.total if loop is not None else 0)
    yield from (over, running, faults)


def _jitter(loop: Any) -> Iterator[Metric]:
    """Synchronization jitter and flagged stragglers of the gangs the loop follows now (see
    :mod:`aicluster.control.loop.health`). A job's series go when its gang ends (its monitor goes),
    so the label sets stay bounded by the running jobs' nodes and ranks."""
    job = GaugeMetricFamily(
        "aicluster_job_sync_jitter_seconds",
        "Synchronization jitter of a running job: median over recent steps of the slowest "
        "rank's compute time minus the fastest rank's.",
        labels=["tenant", "job"],
    )
    node = GaugeMetricFamily(
        "aicluster_node_sync_jitter_seconds",
        "Synchronization jitter of a running job on one node: median over recent steps of the "
        "node's slowest rank's compute time minus the job's fastest rank's.",
        labels=["tenant", "job", "node"],
    )
    straggler = GaugeMetricFamily(
        "aicluster_job_straggler_ratio",
        "A rank flagged as a straggler in a running job: its recent compute time over the "
        "gang's median.",
        labels=["tenant", "job", "rank", "node"],
    )
    monitors = list(loop.gangs.watch.monitors.items()) if loop is not None else []
    records = dict(loop.records) if loop is not None else {}
    for job_id, (monitor, _) in sorted(monitors):
        record = records.get(job_id)
        if record is None:
            continue
        jitter = monitor.jitter  # a snapshot, replaced whole by the loop's thread
        if jitter is not None:
            job.add_metric([record.tenant, job_id], jitter.job)
            for name, seconds in jitter.nodes.items():
                node.add_metric([record.tenant, job_id, name], seconds)
        for rank, flagged in sorted(dict(monitor.flagged).items()):
            labels = [record.tenant, job_id, str(rank), flagged.node or ""]
            straggler.add_metric(labels, flagged.ratio)
    yield from (job, node, straggler)


def _data_families(tally: _EventTally) -> Iterator[Metric]:
    for name, text in _DATA_FIGURES:
        family = CounterMetricFamily(f"aicluster_data_{name}", text, labels=["tenant"])
        for (tenant, figure), value in sorted(tally.data.items()):
            if figure == name:
                family.add_metric([tenant], value)
        yield family


def _alarm_family(tally: _EventTally) -> Metric:
    family = CounterMetricFamily(
        "aicluster_security_alarms",
        "Security alarms raised on the nodes (security.alarm events), by the tenant aimed at "
        "and the alarm (launch_channel.wrong_peer, launch_channel.squatted, ...).",
        labels=["tenant", "alarm"],
    )
    for (tenant, alarm), count in sorted(tally.alarms.items()):
        family.add_metric([tenant, alarm], count)
    return family


def _count(tally: _EventTally, event: Any) -> None:
    tenant = event.tenant or ""
    if event.kind == "security.alarm":
        key = (tenant, str(event.details.get("alarm", "")))
        tally.alarms[key] = tally.alarms.get(key, 0) + 1
    elif event.kind == "job.data":
        for name, _ in _DATA_FIGURES:
            key = (tenant, name)
            tally.data[key] = tally.data.get(key, 0.0) + float(event.details.get(name, 0.0))
    elif event.kind == "job.goodput":
        totals = tally.goodput.setdefault(tenant, _GoodputTotals())
        details = event.details
        totals.productive += float(details.get("productive_seconds", 0.0))
        totals.wall += float(details.get("wall_seconds", 0.0))
        totals.lost += float(details.get("lost_seconds", 0.0))
        totals.restart += float(details.get("restart_seconds", 0.0))
        totals.jobs += 1
    else:
        key = (tenant, event.kind.removeprefix("job."))
        # A job.output_rejected event sums the records it dropped over up to a minute.
        count = event.details.get("count", 1) if event.kind == "job.output_rejected" else 1
        tally.observations[key] = tally.observations.get(key, 0) + int(count)
