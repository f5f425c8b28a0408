"""The live cluster's history as a replayable twin: a trace in the generic CSV, a cluster file
and the configuration in force (what ``aicluster twin export`` writes).

Pure: records in, texts out (the control plane reads the store,
:mod:`aicluster.control.views.twin`).
A job's run time in the trace is the measured length of its *final* run, from its move to
STARTING (the scheduler's admission) to its end; earlier runs, ended by a preemption or a
failure, are lost work (``lost_seconds``), counted beside ``preemptions`` and ``failures``.
Only batch jobs that ran and ended are exported: one still running has no run time yet, one
cancelled while pending never held anything.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from aicluster.core import Cluster, Node, Tenant

__all__ = [
    "TRACE_COLUMNS",
    "Run",
    "TwinJob",
    "cluster_file_text",
    "cluster_text",
    "config_text",
    "runs_of",
    "trace_text",
]

#: The trace's columns: those the simulator reads (sim.traces.load_csv), then the history's own
#: (user, name, parallelism, outcome, preemptions, failures, lost_seconds), which it ignores.
TRACE_COLUMNS = (
    "id",
    "submit_time",
    "duration",
    "num_gpus",
    "workers",
    "tenant",
    "priority",
    "gpu_type",
    "cpus",
    "memory_gb",
    "duration_estimate",
    "predicted_duration",
    "user",
    "name",
    "parallelism",
    "outcome",
    "preemptions",
    "failures",
    "lost_seconds",
)
_ENDS = {"PENDING", "SUCCEEDED", "FAILED", "CANCELLED"}  # a run ends when the job leaves these


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a job: from its admission to the moment it gave its resources back."""

    start: float
    end: float
    preempted: bool  # it ended by a preemption (else a failure, or the job's end)


@dataclass(frozen=True, slots=True)
class TwinJob:
    """What the export needs of one job: its record's fields and its runs."""

    id: str
    tenant: str
    user: str
    name: str
    submitted_at: float
    priority: int
    workers: int
    gpus_per_worker: int
    gpu_type: str
    cpus_per_worker: float
    memory_gb_per_worker: float
    parallelism: tuple[int, int, int]  # data, tensor, pipeline
    duration_estimate: float | None
    outcome: str  # the terminal state
    runs: tuple[Run, ...]
    restarts: int  # restarts in place (RESTARTING): failures that kept the resources
    #: The live loop's prediction of its run time when it first took the job in (none: it
    #: gave an estimate, or predictions were off).
    predicted_duration: float | None = None


def runs_of(transitions: Iterable[tuple[float, str]]) -> tuple[tuple[Run, ...], int]:
    """A job's runs and its restarts in place, from its state changes ``(at, to_state)``,
    oldest first. A run opens at STARTING and closes when the job goes back to PENDING or ends."""
    runs: list[Run] = []
    opened: float | None = None
    preempting = False
    restarts = 0
    for at, state in transitions:
        if state == "STARTING" and opened is None:
            opened, preempting = at, False
        elif state == "PREEMPTING":
            preempting = True
        elif state == "RESTARTING":
            restarts += 1
        elif state in _ENDS and opened is not None:
            runs.append(Run(opened, at, preempting and state == "PENDING"))
            opened = None
    return tuple(runs), restarts


def trace_text(jobs: Sequence[TwinJob], origin: float) -> str:
    """The generic CSV of ``jobs`` that ran, submit times in seconds after ``origin``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(TRACE_COLUMNS)
    for job in sorted(jobs, key=lambda job: (job.submitted_at, job.id)):
        if job.runs:
            writer.writerow(_row(job, origin))
    return out.getvalue()


def _row(job: TwinJob, origin: float) -> list[Any]:
    final, earlier = job.runs[-1], job.runs[:-1]
    preemptions = sum(run.preempted for run in earlier)
    failures = len(earlier) - preemptions + job.restarts + (job.outcome == "FAILED")
    data, tensor, pipeline = job.parallelism
    return [
        job.id,
        _number(max(0.0, job.submitted_at - origin)),
        _number(max(final.end - final.start, 0.001)),  # the loader wants a positive run time
        job.workers * job.gpus_per_worker,
        job.workers,
        job.tenant,
        job.priority,
        job.gpu_type,
        _number(job.cpus_per_worker * job.workers),
        _number(job.memory_gb_per_worker * job.workers),
        "" if job.duration_estimate is None else _number(job.duration_estimate),
        "" if job.predicted_duration is None else _number(job.predicted_duration),
        job.user,
        job.name,
        f"{data}x{tensor}x{pipeline}",
        job.outcome.lower(),
        preemptions,
        failures,
        _number(sum(run.end - run.start for run in earlier)),
    ]


def _number(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


def cluster_text(nodes: Sequence[Node], name: str = "live") -> str:
    """A cluster file (core.configfile's ``nodes`` form) listing ``nodes`` as they are."""
    entries = [_node(node) for node in sorted(nodes, key=lambda node: node.name)]
    return yaml.safe_dump({"name": name, "nodes": entries}, sort_keys=False)


def cluster_file_text(cluster: Cluster) -> str:
    """A cluster file of ``cluster`` whole: its nodes, power table, bandwidth and budgets
    (``parse_cluster`` reads it back as the same cluster)."""
    data: dict[str, Any] = yaml.safe_load(cluster_text(cluster.nodes, cluster.name))
    data["power"] = {gpu: asdict(power) for gpu, power in cluster.power.items()}
    data["bandwidth"] = asdict(cluster.bandwidth)
    for budget in cluster.budgets:
        kind, _, name = budget.name.partition(" ")
        if budget.racks is None:
            data["power_budget_w"] = budget.watts
        elif kind == "rack":
            data.setdefault("racks", {})[name] = {"power_budget_w": budget.watts}
        else:
            spec = {"racks": sorted(budget.racks), "power_budget_w": budget.watts}
            data.setdefault("circuits", {})[name] = spec
    return yaml.safe_dump(data, sort_keys=False)


def _node(node: Node) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": node.name,
        "gpus": node.gpus,
        "gpu_type": node.gpu_type,
        "cpus": node.cpus,
        "memory_gb": node.memory_gb,
        "rack": node.rack,
        "pod": node.pod,
    }
    if node.nvlink_domain_size:
        entry["nvlink_domain_size"] = node.nvlink_domain_size
    if node.labels:
        entry["labels"] = dict(node.labels)
    return entry


def config_text(applied: str | None, tenants: Iterable[Tenant]) -> str:
    """The configuration in force (``applied``: its text; None: the defaults), with the store's
    tenants as its ``tenants`` section, so a replay has their quotas and weights."""
    data: dict[str, Any] = dict(yaml.safe_load(applied or "") or {})
    data["tenants"] = [_tenant(tenant) for tenant in sorted(tenants, key=lambda t: t.name)]
    return yaml.safe_dump(data, sort_keys=False)


def _tenant(tenant: Tenant) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": tenant.name, "weight": tenant.weight}
    for key, value in (("quota", tenant.quota), ("borrow_limit", tenant.borrow_limit)):
        if value:
            entry[key] = dict(value)
    optional: Mapping[str, float | None] = {
        "cpu_quota": tenant.cpu_quota,
        "memory_quota_gb": tenant.memory_quota_gb,
    }
    entry.update({key: value for key, value in optional.items() if value is not None})
    return entry
