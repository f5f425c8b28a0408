"""Each node's power draw as the control plane shows it: measured where the node's meters could
be read (its report, :mod:`aicluster.runtime.cluster.powermeter`: NVML, RAPL), the power model's
figure otherwise, each labelled so; and the racks' sums. Read when asked (a scrape, a page): one
small file a node."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from aicluster.runtime.cluster.powermeter import (
    REPORT_INTERVAL_S,
    Reading,
    power_report_path,
    read_power_report,
)
from aicluster.scheduler import SchedulerState

__all__ = [
    "MEASURED",
    "MODELLED",
    "PARTIAL",
    "NodePower",
    "budget_families",
    "node_power",
    "rack_power",
]

MEASURED, MODELLED, PARTIAL = "measured", "modelled", "partial"
#: A report older than this is a node whose reporter stopped: its figure is the model's again.
STALE_S = 3 * REPORT_INTERVAL_S


@dataclass(frozen=True, slots=True)
class NodePower:
    node: str
    rack: str
    watts: float  # measured if ``source`` says so, else the model's
    source: str  # MEASURED or MODELLED
    meters: tuple[str, ...]  # which meters measured it ("nvml", "rapl"); empty when modelled
    modelled_watts: float  # the power model's figure, always (off: 0)


def node_power(state: SchedulerState, state_dir: str | Path, now: float) -> list[NodePower]:
    """Every node of the scheduler's state, in its order."""
    index = state.index
    found = []
    for i, node in enumerate(index.nodes):
        model = index.node_watts(i)
        report = read_power_report(power_report_path(state_dir, node.name))
        if report is not None and _fresh(report, now) and index.powered_on[i]:
            measured = report.watts
            found.append(NodePower(node.name, node.rack, measured, MEASURED, report.sources, model))
        else:
            found.append(NodePower(node.name, node.rack, model, MODELLED, (), model))
    return found


def _fresh(report: Reading, now: float) -> bool:
    return bool(report.sources) and now - report.at <= STALE_S


def rack_power(nodes: list[NodePower]) -> dict[str, tuple[float, str]]:
    """Per rack: its nodes' watts, and whether they were measured: MEASURED (every node),
    MODELLED (none) or PARTIAL."""
    watts: dict[str, float] = {}
    measured: dict[str, set[bool]] = {}
    for node in nodes:
        watts[node.rack] = watts.get(node.rack, 0.0) + node.watts
        measured.setdefault(node.rack, set()).add(node.source == MEASURED)
    labels = {frozenset({True}): MEASURED, frozenset({False}): MODELLED}
    return {rack: (watts[rack], labels.get(frozenset(measured[rack]), PARTIAL)) for rack in watts}


def budget_families(loop: Any) -> Iterator[Metric]:
    """``/metrics``: the cluster file's power budgets and their racks' modelled draw."""
    limit = GaugeMetricFamily(
        "aicluster_power_budget_watts",
        "A power budget of the cluster file (the cluster, a rack or a circuit).",
        labels=["budget"],
    )
    draw = GaugeMetricFamily(
        "aicluster_power_budget_draw_watts",
        "The modelled draw of a power budget's racks (placement keeps it within the budget).",
        labels=["budget"],
    )
    state = loop.shown if loop is not None else None
    budgets = state.budgets if state is not None else None
    if budgets is not None:
        draws = budgets.draws()
        for budget in budgets.budgets:
            limit.add_metric([budget.name], budget.watts)
            draw.add_metric([budget.name], draws.get(budget.name, 0.0))
    yield from (limit, draw)
