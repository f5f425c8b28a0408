"""What the capacity planner is asked: SLOs (``p95_wait<=1h``) and the grid it varies
(``nodes=8..128:8``, ``gpu_type=A100,H100``, ``racks=4,8``), parsed with readable errors."""

from __future__ import annotations

import itertools
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Grid", "PlanError", "Slo", "parse_slo", "parse_vary"]

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}
#: Per-job statistics: the SLO's word, the summary's prefix (sim.metrics.summarize).
_JOB_STATS = {"wait": "queue_delay", "queue_delay": "queue_delay", "jct": "jct"}
_JOB_STATS["slowdown"] = "slowdown"
#: Run-wide figures: the SLO's word, the summary's key, and whether it falls as the cluster
#: grows (True) or rises (False).
_RUN_FIGURES = {
    "util": ("utilization", True),
    "utilization": ("utilization", True),
    "energy": ("energy_kwh", False),
    "energy_kwh": ("energy_kwh", False),
    "makespan": ("makespan", True),
}
_SECONDS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}
_SLO = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(<=|>=|<|>)\s*([0-9.eE+-]+)\s*([A-Za-z%]*)\s*$")


class PlanError(ValueError):
    """A planner input is wrong: the CLI prints it as one line."""


@dataclass(frozen=True)
class Slo:
    """One objective: ``key`` (a summary key, or a percentile sim.metrics computes) ``op``
    ``bound`` in the summary's units (seconds, a fraction, kWh)."""

    text: str
    key: str
    op: str
    bound: float
    #: True when the metric falls as the cluster grows (waits, JCT, utilization): bigger
    #: clusters meet ``<=`` and miss ``>=``; energy rises.
    falls: bool
    kind: str  # "time", "ratio", "fraction", "energy": how its value reads and prints

    @property
    def helped_by_size(self) -> bool:
        """Whether a bigger cluster is what meets it (the search's side of the objective)."""
        return self.falls == (self.op in ("<=", "<"))

    def met(self, value: float) -> bool:
        return not math.isnan(value) and _OPERATORS[self.op](value, self.bound)

    def show(self, value: float) -> str:
        if math.isnan(value):
            return "-"
        if self.kind == "time":
            return f"{value / 3600:.2f}h"
        if self.kind == "fraction":
            return f"{value * 100:.1f}%"
        return f"{value:,.2f}"


def _stat_key(prefix: str, stat: str) -> str | None:
    """``queue_delay_p95`` for (queue_delay, p95); p50 is the median; None: not a statistic."""
    if stat in ("mean", "median", "avg"):
        return f"{prefix}_{'mean' if stat == 'avg' else stat}"
    match = re.fullmatch(r"p(\d{1,2}(?:\.\d+)?)", stat)
    if match is None or not 0 < float(match.group(1)) < 100:
        return None
    return f"{prefix}_median" if float(match.group(1)) == 50 else f"{prefix}_{stat}"


def _metric(name: str) -> tuple[str, bool, str]:
    """The summary key of ``name``, whether it falls with size, and its kind."""
    lowered = name.lower()
    if lowered in _RUN_FIGURES:
        key, falls = _RUN_FIGURES[lowered]
        kind = {"utilization": "fraction", "energy_kwh": "energy"}.get(key, "time")
        return key, falls, kind
    for word, prefix in _JOB_STATS.items():
        for stat in (lowered.removesuffix(f"_{word}"), lowered.removeprefix(f"{word}_")):
            found = _stat_key(prefix, stat) if stat != lowered else None
            if found is not None:
                return found, True, "ratio" if prefix == "slowdown" else "time"
    raise PlanError(
        f"unknown metric {name!r} (known: p50/p90/p95/p99/mean/median of wait, jct or "
        "slowdown, e.g. p95_wait; utilization; energy_kwh; makespan)"
    )


def _bound(text: str, unit: str, kind: str, slo: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise PlanError(f"--slo {slo!r}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise PlanError(f"--slo {slo!r}: the bound must be a non-negative number")
    unit = unit.lower()
    if kind == "time" and unit in _SECONDS:
        return value * _SECONDS[unit]
    if kind == "time" and not unit:
        return value  # seconds
    if kind == "fraction" and unit == "%":
        return value / 100
    if kind == "energy" and unit in ("", "kwh", "mwh"):
        return value * (1000 if unit == "mwh" else 1)
    if (unit in ("", "x") and kind == "ratio") or (not unit and kind == "fraction"):
        return value
    units = {"time": "s, m, h, d", "fraction": "% or none", "energy": "kWh or MWh", "ratio": "x"}
    raise PlanError(f"--slo {slo!r}: unit {unit!r} does not fit (use {units[kind]} or none)")


def parse_slo(text: str) -> Slo:
    """``METRIC OP BOUND[UNIT]``: ``p95_wait<=1h``, ``utilization>=70%``, ``energy_kwh<=500``."""
    match = _SLO.match(text)
    if match is None:
        raise PlanError(
            f"--slo {text!r}: expected METRIC OP BOUND, e.g. 'p95_wait<=1h' (OP: <=, <, >=, >)"
        )
    name, op, number, unit = match.groups()
    key, falls, kind = _metric(name)
    return Slo(text.strip(), key, op, _bound(number, unit, kind, text), falls, kind)


@dataclass(frozen=True)
class Grid:
    """The sizes to search (node counts, ascending) and the variants of the template around
    them: each GPU type and rack count given (None: the template's)."""

    nodes: tuple[int, ...]
    gpu_types: tuple[str | None, ...] = (None,)
    racks: tuple[int | None, ...] = (None,)

    def variants(self) -> list[tuple[str | None, int | None]]:
        return list(itertools.product(self.gpu_types, self.racks))


def _integers(text: str, what: str) -> tuple[int, ...]:
    """``8..128`` (step 1), ``8..128:8`` or ``8,16,32``: positive whole numbers, ascending."""
    range_match = re.fullmatch(r"\s*(\d+)\s*\.\.\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if range_match:
        low, high = int(range_match.group(1)), int(range_match.group(2))
        step = int(range_match.group(3) or 1)
        if step < 1 or low < 1 or high < low:
            raise PlanError(f"--vary {what}={text}: expected LOW..HIGH[:STEP], 1 <= LOW <= HIGH")
        return tuple(range(low, high + 1, step))
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise PlanError(f"--vary {what}={text}: expected LOW..HIGH[:STEP] or a list like 4,8")
    return tuple(sorted({int(part) for part in parts}))


def parse_vary(texts: Sequence[str]) -> Grid:
    """``nodes=LOW..HIGH[:STEP]`` (required) and optionally ``gpu_type=A,B``, ``racks=...``."""
    given: dict[str, str] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        name = name.strip()
        if not sep or not value.strip():
            raise PlanError(f"--vary {text!r}: expected NAME=VALUES, e.g. nodes=8..128")
        if name not in ("nodes", "gpu_type", "racks"):
            raise PlanError(f"--vary {text!r}: unknown dimension {name!r} (nodes, gpu_type, racks)")
        if name in given:
            raise PlanError(f"--vary {name} is given twice")
        given[name] = value.strip()
    if "nodes" not in given:
        raise PlanError("--vary nodes=LOW..HIGH[:STEP] is required (the size searched)")
    gpu_types: tuple[str | None, ...] = (None,)
    if "gpu_type" in given:
        names = [part.strip() for part in given["gpu_type"].split(",")]
        if not all(names):
            raise PlanError(f"--vary gpu_type={given['gpu_type']}: expected names like A100,H100")
        gpu_types = tuple(dict.fromkeys(names))
    racks = _integers(given["racks"], "racks") if "racks" in given else (None,)
    return Grid(_integers(given["nodes"], "nodes"), gpu_types, racks)
