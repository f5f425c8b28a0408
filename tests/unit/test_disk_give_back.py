"""Ended jobs' disks are given back off the control loop's tick (control/loop/diskreturn.py): a
give-back that takes long (a tenant's million small files to copy) stops no one's scheduling."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from aicluster.control.loop.diskreturn import DiskGiveBack
from aicluster.core import JobState, ManualClock
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from fakeruntime import FakeRuntime, Script, fake_loop, run_until, state, submit, two_tenant_store


class SlowDisks(FakeRuntime):
    """A runtime whose give-back blocks until the test lets it go."""

    def __init__(self, clock: ManualClock, state_dir: Path) -> None:
        super().__init__(clock, state_dir)
        self.let_go, self.began = threading.Event(), threading.Event()
        self.calls = 0

    def release_disks(self, active: Callable[[str], bool]) -> list[str]:
        self.calls += 1
        self.began.set()
        assert self.let_go.wait(30), "the test never let the give-back go"
        return []


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[Store]:
    with two_tenant_store(tmp_path / "db", clock) as opened:
        yield opened


def test_a_slow_give_back_does_not_stop_the_tick_and_the_next_follows(
    store: Store, clock: ManualClock, tmp_path: Path
) -> None:
    runtime = SlowDisks(clock, tmp_path / "state")
    config = SchedulerConfig(queue="priority")
    with fake_loop(store, clock, tmp_path / "state", config, runtime=runtime) as (loop, _):
        first = submit(store, "first", tenant="a")
        runtime.scripts[first.id] = Script(steps=2, step_s=1.0)
        run_until(loop, clock, lambda: state(store, first) is JobState.SUCCEEDED)
        assert runtime.began.wait(10) and runtime.calls == 1  # a give-back began, and blocks
        other = submit(store, "other", tenant="b")
        runtime.scripts[other.id] = Script(steps=5, step_s=1.0)
        run_until(loop, clock, lambda: state(store, other) is JobState.SUCCEEDED)
        assert runtime.calls == 1  # one at a time: no second began meanwhile
        runtime.let_go.set()
        assert loop.disks.running is not None
        loop.disks.running.result(timeout=10)
        clock.advance(5)
        loop.tick()  # the next give-back begins (its thread counts it)
        assert loop.disks.running is not None
        loop.disks.running.result(timeout=10)
        assert runtime.calls == 2


def test_the_give_back_starts_at_most_every_interval() -> None:
    disks, started = DiskGiveBack(interval_s=5), []
    assert disks.kick(0.0, lambda: started.append(0))
    assert disks.running is not None
    disks.running.result(timeout=10)
    assert not disks.kick(4.9, lambda: started.append(1))
    assert disks.kick(5.0, lambda: started.append(2))
    disks.running.result(timeout=10)
    disks.shutdown()
    assert started == [0, 2]
