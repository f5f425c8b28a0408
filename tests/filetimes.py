"""Time per test file, printed at the end of every run: where the suite's budget goes.

Each test's setup, call and teardown are added to its file (a module fixture's setup counts for
the file's first test). ``AICLUSTER_FILE_BUDGET_S`` (seconds; unset: no limit) fails the run
when one file takes longer: the suite's budget is 20 minutes on a 2-core machine
(``docs/testing.md``), so no file may take a large part of it.

The files also run slowest first (``tests/filetimes.json``, the times of an earlier run): with
two workers (pytest-xdist, a file each at a time) a long file started last would end alone.
Files the record does not know follow in collection order. ``AICLUSTER_ORDER_BY_TIME=0`` keeps
collection order; ``make filetimes`` records the times anew (``AICLUSTER_RECORD_FILETIMES``).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

_seconds: defaultdict[str, float] = defaultdict(float)
RECORD = Path(__file__).with_name("filetimes.json")


def _recorded() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(RECORD.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("AICLUSTER_ORDER_BY_TIME") == "0":
        return
    recorded = _recorded()
    # A stable sort: a file's tests keep their order, and unknown files their collection order.
    items.sort(key=lambda item: -recorded.get(item.nodeid.split("::", 1)[0], 0.0))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid.split("::", 1)[0]] += report.duration


def over_budget() -> list[tuple[str, float]]:
    """The files over ``AICLUSTER_FILE_BUDGET_S``, slowest first (none when it is unset)."""
    budget = os.environ.get("AICLUSTER_FILE_BUDGET_S")
    if not budget:
        return []
    limit = float(budget)
    return sorted(((f, s) for f, s in _seconds.items() if s > limit), key=lambda x: -x[1])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time per test file (setup, call and teardown)")
    ranked = sorted(_seconds.items(), key=lambda item: -item[1])
    for path, seconds in ranked[:25]:
        write(f"{seconds:8.1f} s  {path}")
    tiers: defaultdict[str, float] = defaultdict(float)
    for path, seconds in _seconds.items():
        tiers[path.split("/")[1] if path.count("/") >= 2 else path] += seconds
    write("by tier: " + ", ".join(f"{tier} {s:.0f} s" for tier, s in sorted(tiers.items())))
    write(f"all tests: {sum(_seconds.values()):.0f} s in {len(_seconds)} files")
    for path, seconds in over_budget():
        write(f"OVER BUDGET: {path} took {seconds:.0f} s", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("AICLUSTER_RECORD_FILETIMES")
    if target and _seconds:
        ranked = dict(sorted(((f, round(s, 1)) for f, s in _seconds.items()), key=lambda x: -x[1]))
        Path(target).write_text(json.dumps(ranked, indent=1) + "\n")
    if over_budget() and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
