"""A failed attempt explains itself: the control loop stores, with the job's RESTARTING and FAILED
transitions and (once FAILED) with the job, its first failed rank and node, the exit code or the
signal that killed it, and the last lines of that rank's stderr, made printable and bounded.

Over the fake runtime (``tests/fakeruntime.py``), on the injected clock, with the real store
(SQLite), scheduler and loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.control.loop.loop import ControlLoop
from aicluster.core import JobState, ManualClock
from aicluster.core.failure import LINE_CHARS, TAIL_LINES, clean_tail
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from fakeruntime import FakeRuntime, Script, fake_loop, run_until, state, submit, two_tenant_store

START = 1_700_000_000.0
TRACEBACK = "\n".join(
    [
        "loading data",
        "Traceback (most recent call last):",
        *(f'  File "/work/train.py", line {n}, in step_{n}\n    step_{n + 1}()' for n in range(8)),
        "ValueError: loss is nan at step 20",
        "",
    ]
)


Live = tuple[ControlLoop, FakeRuntime, Store, ManualClock]


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    """A loop over the fake runtime, its store (tenants a and b, two 8-GPU nodes) and clock."""
    clock = ManualClock(START)
    with two_tenant_store(tmp_path / "db", clock) as store:
        config = SchedulerConfig(queue="priority")
        with fake_loop(store, clock, tmp_path / "state", config) as (loop, runtime):
            yield loop, runtime, store, clock


def test_a_failed_job_keeps_its_failing_rank_node_exit_and_traceback_tail(
    live: Live,
) -> None:
    loop, runtime, store, clock = live
    job = submit(store, "raises", workers=2, max_restarts=1)
    runtime.scripts[job.id] = Script(
        steps=3, exit_code=1, stderr=TRACEBACK, failing_ranks=frozenset({1})
    )
    run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
    failed = store.get_job(None, job.id)
    failure = dict(failed.failure or {})
    node = runtime.gangs[(job.id, 2)].nodes[1]
    assert failure["rank"] == 1 and failure["node"] == node
    assert (failure["exit_code"], failure["signal"], failure["lost"]) == (1, None, False)
    assert failure["attempt"] == 2 and failure["summary"] == f"rank 1 on {node} exited with code 1"
    tail = failure["stderr_tail"]
    assert len(tail) == TAIL_LINES and tail[-1] == "ValueError: loss is nan at step 20"
    assert tail == list(clean_tail(TRACEBACK))
    assert failed.exit_code == 1 and "ValueError: loss is nan" in (failed.exit_message or "")
    # Each failed attempt logs its own failure with its transition.
    logged = [
        (e.to_state, e.details["failure"]["attempt"])
        for e in store.events(job.id)
        if "failure" in e.details
    ]
    assert logged == [("RESTARTING", 1), ("FAILED", 2)]


def test_a_killed_rank_is_named_by_its_signal_and_its_stderr_is_made_printable(
    live: Live,
) -> None:
    loop, runtime, store, clock = live
    job = submit(store, "killed")
    hostile = "ok\n\x1b[2J\x1b]0;pwned\x07bell\tand tab\u202e\n" + "x" * 10_000 + "\n"
    runtime.scripts[job.id] = Script(steps=2, exit_code=-9, stderr=hostile)
    run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
    failure = dict(store.get_job(None, job.id).failure or {})
    assert (failure["exit_code"], failure["signal"]) == (-9, "SIGKILL")
    assert failure["summary"].endswith("was killed by SIGKILL")
    first, second, third = failure["stderr_tail"]
    assert first == "ok" and second == "[2J]0;pwnedbell and tab"  # no escape, no BiDi
    assert len(third) == LINE_CHARS and third.endswith("…")


def test_a_rank_lost_with_its_node_is_a_lost_failure_without_an_exit(
    live: Live,
) -> None:
    loop, runtime, store, clock = live
    job = submit(store, "lost")
    runtime.scripts[job.id] = Script(steps=30)
    run_until(loop, clock, lambda: state(store, job) is JobState.RUNNING)
    clock.advance(5)
    node = runtime.gangs[(job.id, 1)].nodes[0]
    runtime.lose_node(node)
    run_until(loop, clock, lambda: state(store, job) is JobState.FAILED)
    failure = dict(store.get_job(None, job.id).failure or {})
    assert (failure["rank"], failure["node"], failure["lost"]) == (0, node, True)
    assert (failure["exit_code"], failure["signal"], failure["stderr_tail"]) == (None, None, [])
    assert "was lost" in failure["summary"]


def test_a_job_that_succeeds_keeps_no_failure(
    live: Live,
) -> None:
    loop, runtime, store, clock = live
    ok = submit(store, "ok")
    runtime.scripts[ok.id] = Script(steps=2)
    run_until(loop, clock, lambda: state(store, ok) is JobState.SUCCEEDED)
    assert store.get_job(None, ok.id).failure is None
