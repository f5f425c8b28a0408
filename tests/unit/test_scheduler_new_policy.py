"""A newcomer's policy, added by the recipe in docs/scheduler.md ("How to add a policy"):
a plain QueuePolicy subclass, registered by name, selected by the configuration file, and the
same decisions with the shortcut layer on and off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from aicluster.configuration import parse_configuration, scheduler_config
from aicluster.scheduler import names
from aicluster.scheduler.entries import PendingEntry, RunningEntry
from aicluster.scheduler.policies.base import QueuePolicy, register, registry
from builders import Driver, admitted, make_job, small_cluster


class BiggestFirstPolicy(QueuePolicy):
    """The toy: the widest gang first; a wider waiting job may preempt a narrower running one."""

    name = "biggest-first"
    preemptive = True

    def key(self, entry: PendingEntry, now: float) -> tuple[float, ...]:
        return (-float(entry.job.total_gpus), entry.job.submit_time)

    def may_preempt(self, entry: PendingEntry, victim: RunningEntry, now: float) -> bool:
        return entry.job.total_gpus > victim.job.total_gpus


@pytest.fixture
def toy() -> Iterator[str]:
    register(BiggestFirstPolicy)
    try:
        yield BiggestFirstPolicy.name
    finally:
        del registry[BiggestFirstPolicy.name]


def _config(name: str, shortcuts: bool) -> dict[str, object]:
    text = f"policy:\n  name: {name}\nscheduler:\n  shortcuts: {str(shortcuts).lower()}\n"
    configuration, _ = parse_configuration(text, "toy.yaml")  # the name is known once registered
    config = scheduler_config(configuration)
    return {"queue": config.queue, "shortcuts": config.shortcuts, "backfill": config.backfill}


def _replay(name: str, shortcuts: bool) -> list[tuple[list[str], list[str]]]:
    driver = Driver(small_cluster(nodes=1, gpus=8), **_config(name, shortcuts))
    driver.submit(*(make_job(f"small-{i}").gpus(2).at(i) for i in range(4)))
    trace = []
    plan = driver.cycle()
    trace.append((admitted(plan), [p.job_id for p in plan.preemptions]))
    driver.submit(make_job("wide").gpus(6).at(10))
    plan = driver.cycle(at=10)
    trace.append((admitted(plan), [p.job_id for p in plan.preemptions]))
    return trace


def test_a_registered_policy_is_selected_by_its_name(toy: str) -> None:
    assert toy in names()
    driver = Driver(small_cluster(nodes=1, gpus=8), queue=toy)
    driver.submit(make_job("narrow").gpus(2).at(0), make_job("wide").gpus(8).at(1))
    assert admitted(driver.cycle()) == ["wide"]  # the widest first, though it came later


def test_its_preemption_right_and_the_same_decisions_without_shortcuts(toy: str) -> None:
    with_shortcuts = _replay(toy, shortcuts=True)
    first, second = with_shortcuts
    assert sorted(first[0]) == ["small-0", "small-1", "small-2", "small-3"]
    assert second[0] == ["wide"] and len(second[1]) == 3  # three 2-GPU jobs make room for 6
    assert _replay(toy, shortcuts=False) == with_shortcuts


def test_an_unknown_policy_name_is_refused_by_the_configuration() -> None:
    with pytest.raises(Exception, match="unknown policy 'biggest-first'"):
        parse_configuration("policy:\n  name: biggest-first\n", "toy.yaml")
