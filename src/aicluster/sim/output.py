"""Write a run's results as JSON and CSV, and the comparison columns shared by CLI and report."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aicluster.sim.metrics import SimResult, preemption_summary, summarize

__all__ = ["COMPARISON", "TERMINAL_COLUMNS", "comparison_rows", "write_outputs", "write_results"]


def _hours(value: float) -> str:
    return "-" if math.isnan(value) else f"{value / 3600:,.2f}"


def _number(digits: int, scale: float = 1.0, suffix: str = "") -> Callable[[Any], str]:
    def render(value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        return f"{value * scale:,.{digits}f}{suffix}"

    return render


#: (column label, summary key, formatter): the policy comparison, in the CLI and the report.
#: Labels are short so the table fits a terminal; JCT, wait and slowdown are means unless p50/p95/
#: p99; "lost GPUh" is GPU-hours lost to node failures, "pre-lost GPUh" to preemptions, and
#: "evict/GPUh" counts preemptions per admitted GPU-hour (core.preemption_cost).
COMPARISON: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("policy", "policy", str),
    ("done", "completed", _number(0)),
    ("JCT h", "jct_mean", _hours),
    ("p50 h", "jct_median", _hours),
    ("p95 h", "jct_p95", _hours),
    ("p99 h", "jct_p99", _hours),
    ("wait h", "queue_delay_mean", _hours),
    ("slowdown", "slowdown_mean", _number(1)),
    ("span d", "makespan", _number(1, 1 / 86400)),
    ("util", "utilization", _number(1, 100, "%")),
    ("Jain", "jain_fairness", _number(3)),
    ("preempt", "preemptions", _number(0)),
    ("failures", "failures", _number(0)),
    ("lost GPUh", "lost_gpu_hours_failures", _number(0)),
    ("pre-lost GPUh", "lost_gpu_hours_preemptions", _number(0)),
    ("evict/GPUh", "evictions_per_gpu_hour", _number(4)),
    ("goodput", "goodput", _number(2, 100, "%")),
    ("MWh", "energy_kwh", _number(1, 1 / 1000)),
    ("wall s", "wall_seconds", _number(1)),
)


#: The columns a terminal shows (the report and CSV have them all).
TERMINAL_COLUMNS = tuple(c for c in COMPARISON if c[0] not in ("p50 h", "span d", "failures"))


def comparison_rows(
    summaries: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, str, Callable[[Any], str]]] = COMPARISON,
) -> list[list[str]]:
    """One row of formatted cells per run, in ``columns`` order."""
    return [[render(summary[key]) for _, key, render in columns] for summary in summaries]


def write_results(
    results: Sequence[SimResult], out: Path, *, jobs_csv: bool = True
) -> list[dict[str, Any]]:
    """Summaries as JSON and CSV (with the cost of preemption, per tenant in
    ``preemption-cost.csv``), and per run its jobs (optional) and time series as CSV."""
    summaries = [summarize(result) | preemption_summary(result) for result in results]
    write_outputs(results, summaries, out, jobs_csv=jobs_csv)
    return summaries


def write_outputs(
    results: Sequence[SimResult],
    summaries: Sequence[dict[str, Any]],
    out: Path,
    *,
    jobs_csv: bool = True,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "runs": [_clean(summary) for summary in summaries],
        "settings": _clean(results[0].settings) if results else {},
    }
    (out / "summary.json").write_text(json.dumps(document, indent=2) + "\n")
    _write_summary_csv(summaries, out / "summary.csv")
    _write_cost_csv(summaries, out / "preemption-cost.csv")
    for result in results:
        if jobs_csv:
            _write_jobs_csv(result, out / f"jobs-{result.policy}.csv")
        _write_series_csv(result, out / f"series-{result.policy}.csv")


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


def _write_summary_csv(summaries: Sequence[dict[str, Any]], path: Path) -> None:
    first = summaries[0] if summaries else {}
    fields = [key for key, value in first.items() if not isinstance(value, dict)]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        for summary in summaries:
            writer.writerow([_cell(summary[key]) for key in fields])


#: The per-tenant cost's columns (``preemption-cost.csv``), after policy and tenant.
_COST_FIELDS = ("preemptions", "lost_gpu_hours", "admitted_gpu_hours", "evictions_per_gpu_hour")
_KINDS = ("reclaim", "priority", "policy")


def _write_cost_csv(summaries: Sequence[dict[str, Any]], path: Path) -> None:
    """Each run's tenants' cost of preemption, one row per (policy, tenant)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "tenant", *_COST_FIELDS, *(f"{k}_preemptions" for k in _KINDS)])
        for summary in summaries:
            for tenant, cost in summary.get("preemption_cost", {}).items():
                kinds = cost["by_kind"]
                figures = [_cell(cost[name]) for name in _COST_FIELDS]
                by_kind = [kinds.get(kind, 0) for kind in _KINDS]
                writer.writerow([summary["policy"], tenant, *figures, *by_kind])


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def _write_jobs_csv(result: SimResult, path: Path) -> None:
    jobs = result.jobs
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "id",
                "tenant",
                "gpus",
                "submit_time",
                "duration",
                "start_time",
                "end_time",
                "jct",
                "queue_delay",
                "slowdown",
                "restarts",
            ]
        )
        for i, job_id in enumerate(jobs.ids):
            submit, start, end = jobs.submit[i], jobs.start[i], jobs.end[i]
            jct = end - submit
            writer.writerow(
                [
                    job_id,
                    result.tenants[jobs.tenant[i]],
                    jobs.gpus[i],
                    _cell(submit),
                    _cell(jobs.duration[i]),
                    _cell(start),
                    _cell(end),
                    _cell(jct),
                    _cell(start - submit),
                    _cell(jct / jobs.duration[i]),
                    jobs.restarts[i],
                ]
            )


def _write_series_csv(result: SimResult, path: Path) -> None:
    series = result.series
    names = list(series.columns)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["time", "utilization", *names])
        for i, when in enumerate(series.times):
            busy = series.columns["busy_gpus"][i]
            row = [series.columns[name][i] for name in names]
            writer.writerow(
                [_cell(when), _cell(busy / result.total_gpus), *(_cell(v) for v in row)]
            )
