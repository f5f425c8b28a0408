"""The planner's report: every replay as a CSV row, a JSON summary with the answers, a small
SVG of each SLO's metric against size, and the cluster file of each size replayed (so that
``aicluster sim --cluster`` can replay any of them again)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from aicluster.core import Cluster
from aicluster.sim.plan import Plan, VariantPlan, plan_rows, scale_cluster
from aicluster.sim.plan_spec import Slo
from aicluster.sim.twin import cluster_file_text

__all__ = ["answer_line", "cluster_file", "write_report"]

#: Figures every row carries besides the SLOs' own.
_FIGURES = ("queue_delay_p95", "jct_p95", "slowdown_mean", "utilization", "energy_kwh")


def answer_line(variant: VariantPlan) -> str:
    """``smallest: N nodes (M GPUs)``, naming the variant where the grid has several."""
    named = ", ".join(
        f"{key}={value}"
        for key, value in (("gpu_type", variant.gpu_type), ("racks", variant.racks))
        if value is not None
    )
    suffix = f" [{named}]" if named else ""
    if variant.answer is None:
        return f"smallest: none{suffix}: {variant.note}"
    trial = variant.trials[variant.answer]
    check = (
        f"; {variant.below} node{'s miss' if variant.below > 1 else ' misses'}"
        if variant.below is not None
        else "; the grid's smallest size"
    )
    return f"smallest: {trial.nodes} nodes ({trial.gpus:,} GPUs){suffix}{check}"


def cluster_file(out: Path, variant: VariantPlan, nodes: int) -> Path:
    parts = [f"nodes-{nodes}"]
    parts += [str(v) for v in (variant.gpu_type, variant.racks) if v is not None]
    return out / "clusters" / f"{'-'.join(parts)}.yaml"


def write_report(plan: Plan, template: Cluster, out: Path) -> list[Path]:
    """plan.csv, plan.json, plan.svg and clusters/*.yaml under ``out``."""
    (out / "clusters").mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys([*(slo.key for slo in plan.slos), *_FIGURES]))
    rows = []
    for variant, trial in plan_rows(plan):
        path = cluster_file(out, variant, trial.nodes)
        cluster = scale_cluster(template, trial.nodes, variant.gpu_type, variant.racks)
        path.write_text(cluster_file_text(cluster), encoding="utf-8")
        row: dict[str, Any] = {
            "gpu_type": variant.gpu_type or "",
            "racks": variant.racks or "",
            "nodes": trial.nodes,
            "gpus": trial.gpus,
            **{key: trial.figures.get(key, math.nan) for key in keys},
            "met": trial.all_met,
            "cluster": str(path.relative_to(out)),
        }
        rows.append(row)
    with open(out / "plan.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["nodes"])
        writer.writeheader()
        writer.writerows(rows)
    (out / "plan.json").write_text(json.dumps(_summary(plan, rows), indent=2, allow_nan=False))
    (out / "plan.svg").write_text(_svg(plan), encoding="utf-8")
    return [out / "plan.csv", out / "plan.json", out / "plan.svg"]


def _summary(plan: Plan, rows: list[dict[str, Any]]) -> dict[str, Any]:
    def clean(value: Any) -> Any:
        return None if isinstance(value, float) and math.isnan(value) else value

    return {
        "slos": [
            {"text": s.text, "metric": s.key, "op": s.op, "bound": s.bound} for s in plan.slos
        ],
        "grid": {
            "nodes": list(plan.grid.nodes),
            "gpu_type": list(plan.grid.gpu_types),
            "racks": list(plan.grid.racks),
        },
        "answers": [
            {
                "gpu_type": v.gpu_type,
                "racks": v.racks,
                "nodes": v.answer,
                "gpus": v.trials[v.answer].gpus if v.answer is not None else None,
                "below": v.below,
                "note": v.note,
                "line": answer_line(v),
            }
            for v in plan.variants
        ],
        "tried": [{key: clean(value) for key, value in row.items()} for row in rows],
    }


_WIDTH, _HEIGHT, _PAD = 420, 160, 40


def _svg(plan: Plan) -> str:
    """One small line chart per SLO: its metric against nodes, a line per variant, the bound
    dashed (red)."""
    charts = [_chart(plan, slo, index * (_HEIGHT + 20)) for index, slo in enumerate(plan.slos)]
    total = len(plan.slos) * (_HEIGHT + 20)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{total}">\n'
        + "\n".join(charts)
        + "\n</svg>\n"
    )


def _chart(plan: Plan, slo: Slo, top: int) -> str:
    series = [
        [(n, t.figures.get(slo.key, math.nan)) for n, t in v.trials.items()] for v in plan.variants
    ]
    finite = [y for points in series for _, y in points if math.isfinite(y)] + [slo.bound]
    x0, x1 = plan.grid.nodes[0], max(plan.grid.nodes[-1], plan.grid.nodes[0] + 1)
    y1 = max(finite) or 1.0

    def at(x: float, y: float) -> str:
        px = _PAD + (x - x0) / (x1 - x0) * (_WIDTH - 2 * _PAD)
        py = top + _HEIGHT - _PAD / 2 - y / y1 * (_HEIGHT - _PAD)
        return f"{px:.1f},{py:.1f}"

    lines = [f'<text x="{_PAD}" y="{top + 14}" font-size="12">{_escape(slo.text)}</text>']
    for points in series:
        shown = " ".join(at(x, y) for x, y in points if math.isfinite(y))
        lines.append(f'<polyline fill="none" stroke="#1f77b4" points="{shown}"/>')
    bound = f"{at(x0, slo.bound)} {at(x1, slo.bound)}"
    lines.append(f'<polyline fill="none" stroke="#d62728" stroke-dasharray="4" points="{bound}"/>')
    label = f"nodes {x0}..{x1}; top {slo.show(y1)}"
    lines.append(f'<text x="{_PAD}" y="{top + _HEIGHT + 8}" font-size="10">{label}</text>')
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
