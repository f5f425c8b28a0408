"""The report: PNG plots (matplotlib, no display needed) and one self-contained HTML page.

Figures are drawn on ``matplotlib.figure.Figure`` objects rather than through pyplot, so nothing
depends on a global backend or window state.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from aicluster.sim.metrics import SimResult
from aicluster.sim.output import COMPARISON, comparison_rows

__all__ = ["PLOTS", "write_report"]

#: The PNG files a report holds, in page order.
PLOTS = ("timeline.png", "jct_cdf.png", "tenant_share.png")

_DAY = 86_400.0


def write_report(
    results: Sequence[SimResult],
    summaries: Sequence[dict[str, Any]],
    out: Path,
    *,
    title: str = "aicluster simulation",
) -> Path:
    """Write the plots and ``report.html`` under ``out``; returns the HTML page's path."""
    out.mkdir(parents=True, exist_ok=True)
    _timeline(results).savefig(out / PLOTS[0], dpi=110)
    _jct_cdf(results).savefig(out / PLOTS[1], dpi=110)
    _tenant_share(summaries).savefig(out / PLOTS[2], dpi=110)
    page = out / "report.html"
    page.write_text(_html(results, summaries, out, title))
    return page


def _timeline(results: Sequence[SimResult]) -> Figure:
    """Utilization and queue length over simulated time, one line per policy."""
    figure = Figure(figsize=(10, 6), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True)
    for result in results:
        series = result.series
        days = np.frombuffer(series.times, dtype=np.float64) / _DAY
        busy = np.frombuffer(series.columns["busy_gpus"], dtype=np.float64)
        queued = np.frombuffer(series.columns["queued_jobs"], dtype=np.float64)
        top.plot(days, 100 * busy / result.total_gpus, label=result.policy, linewidth=0.9)
        bottom.plot(days, queued, label=result.policy, linewidth=0.9)
    top.set_ylabel("GPU utilization (%)")
    top.set_ylim(0, 105)
    top.set_title("Utilization and queue length over time")
    bottom.set_ylabel("queued jobs")
    bottom.set_xlabel("simulated time (days)")
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
        axes.legend(loc="upper right", fontsize="small")
    return figure


def _jct_cdf(results: Sequence[SimResult]) -> Figure:
    """Cumulative distribution of job completion times, one curve per policy (log time)."""
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.subplots()
    for result in results:
        end = np.frombuffer(result.jobs.end, dtype=np.float64)
        submit = np.frombuffer(result.jobs.submit, dtype=np.float64)
        done = ~np.isnan(end)
        jct = np.sort(end[done] - submit[done]) / 3600
        if jct.size:
            axes.plot(jct, np.arange(1, jct.size + 1) / jct.size, label=result.policy)
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (hours, log scale)")
    axes.set_ylabel("fraction of jobs")
    axes.set_title("JCT CDF per policy")
    axes.grid(alpha=0.3, which="both")
    axes.legend(loc="lower right")
    return figure


def _tenant_share(summaries: Sequence[dict[str, Any]]) -> Figure:
    """Each tenant's share of the GPU-hours, bars grouped by tenant, one bar per policy."""
    tenants = sorted(
        {name for summary in summaries for name in summary["tenant_share"]},
        key=lambda name: -max(s["tenant_share"].get(name, 0.0) for s in summaries),
    )
    figure = Figure(figsize=(max(6.0, 0.6 * len(tenants) + 3), 4.5), layout="constrained")
    axes = figure.subplots()
    width = 0.8 / max(1, len(summaries))
    positions = np.arange(len(tenants))
    for k, summary in enumerate(summaries):
        shares = [100 * summary["tenant_share"].get(name, 0.0) for name in tenants]
        axes.bar(positions + k * width, shares, width, label=summary["policy"])
    axes.set_xticks(positions + width * (len(summaries) - 1) / 2, tenants, rotation=45)
    axes.set_ylabel("share of GPU-hours (%)")
    axes.set_title("Per-tenant share")
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize="small")
    return figure


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th { background: #f2f2f2; }
td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; display: block; margin: 1em 0; }
.note { color: #555; font-size: 0.9em; }
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_COST_HEADER = ("preemptions", "reclaim", "priority", "policy", "lost GPU-h", "evict/GPU-h")


def _cost_rows(summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Per run and tenant: its preemptions, by kind, their lost GPU-hours and evictions per
    admitted GPU-hour (tenants never preempted left out)."""
    rows = []
    for summary in summaries:
        for tenant, cost in summary.get("preemption_cost", {}).items():
            if not cost["preemptions"]:
                continue
            kinds = cost["by_kind"]
            rows.append(
                [
                    summary["policy"],
                    tenant,
                    f"{cost['preemptions']:,}",
                    *(f"{kinds.get(kind, 0):,}" for kind in ("reclaim", "priority", "policy")),
                    f"{cost['lost_gpu_hours']:,.1f}",
                    f"{cost['evictions_per_gpu_hour']:.4f}",
                ]
            )
    return rows


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _html(
    results: Sequence[SimResult], summaries: Sequence[dict[str, Any]], out: Path, title: str
) -> str:
    first = results[0] if results else None
    facts = (
        f"{first.cluster}: {first.total_gpus:,} GPUs; {len(first.jobs):,} jobs; "
        f"{first.totals.end_time / _DAY:,.1f} simulated days"
        if first
        else "no runs"
    )
    tenants = sorted({name for s in summaries for name in s["tenant_share"]})
    share_rows = [
        [name, *(f"{100 * s['tenant_share'].get(name, 0.0):.1f}%" for s in summaries)]
        for name in tenants
    ]
    settings = html.escape(repr(first.settings)) if first else ""
    images = "".join(_image(out / name, name) for name in PLOTS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(facts)}</p>
<h2>Policy comparison</h2>
{_table([label for label, _, _ in COMPARISON], comparison_rows(summaries))}
<p class="note">JCT: job completion time (submission to end); wait: submission to first start;
slowdown: JCT / run time; Jain: fairness of each tenant's GPUs against its max-min fair share,
averaged over contended instants; lost GPU-h: work since the last checkpoint lost to node
failures; pre-lost GPU-h: the same lost to preemptions; evict/GPU-h: preemptions per admitted
GPU-hour; goodput: GPU time kept over GPU time allocated.</p>
{images}
<h2>Cost of preemption per tenant</h2>
{_table(["policy", "tenant", *_COST_HEADER], _cost_rows(summaries))}
<h2>Per-tenant share of GPU-hours</h2>
{_table(["tenant", *(s["policy"] for s in summaries)], share_rows)}
<p class="note">Settings: {settings}</p>
</body></html>
"""
