"""Preemption settles: the cycle checker (``tests/cycles.py``) over every tiny world and, by
Hypothesis (derandomized), beyond; it finds the known cycle and a planted one under rights that
do not settle. A longer sweep: ``bench/preemption_cycles.py``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aicluster.core import DomainLevel
from aicluster.scheduler.preemption import candidates
from aicluster.scheduler.rights import LEGACY_RIGHTS
from cycles import POLICIES, Spec, World, cycle_of, early_preemptions, row, tiny_worlds

_NODE = DomainLevel.NVLINK

#: Worlds that cycled under some rights (found, then kept). Each must settle by default.
FOUND = {
    # tests/unit/test_scheduler_reclaim_cycle.py: c reclaims from a's j2, c's j3 preempts j4
    # by priority while borrowing, a's j2 preempts j3 by priority, c reclaims again.
    "reclaim and a borrower's priority (28 Nov)": World(
        nodes=3,
        gpus_per_node=4,
        tenants=(("a", 0, 10), ("b", 4, 0), ("c", 2, 6)),
        jobs=(
            Spec("a", 1, 1, 100, False, domain=_NODE),
            Spec("a", 4, 2, 100, False, domain=DomainLevel.POD),
            Spec("a", 2, 1, 300, domain=_NODE),
            Spec("c", 3, 2, 200, domain=DomainLevel.POD),
            Spec("c", 2, 1, 100, domain=_NODE),
            Spec("b", 1, 2, 100, False, domain=_NODE),
            Spec("a", 1, 1, 100, False, domain=_NODE),
            Spec("b", 2, 1, 100, False, domain=_NODE),
            *(Spec("a", 1, 1, 100, False, domain=_NODE) for _ in range(6)),
        ),
        nodes_per_rack=1,
        racks_per_pod=2,
    ),
    # Found by the tiny worlds under LEGACY_RIGHTS: Tiresias' right takes a higher-priority
    # job, whose priority takes the GPU back.
    "the policy's right against priority": World(
        nodes=1,
        gpus_per_node=2,
        tenants=(("a", None, None), ("b", None, None)),
        jobs=(Spec("a", 1, 2, 100, True, 0.0, 100.0), Spec("a", 1, 2, 200, True, 100.0, 200.0)),
        policy="tiresias",
    ),
}


@pytest.mark.parametrize("name", FOUND)
def test_found_worlds_settle(name: str) -> None:
    assert cycle_of(FOUND[name]) is None


def test_the_known_cycle_is_found_under_the_legacy_rights() -> None:
    trace = cycle_of(FOUND["reclaim and a borrower's priority (28 Nov)"], LEGACY_RIGHTS)
    assert trace is not None and trace[-1] in trace[:-1]


def _first_cycle(worlds: list[World], rights: object = None) -> World | None:
    for world in worlds:
        if cycle_of(world, rights) is not None:  # type: ignore[arg-type]
            print(row("found", world))
            return world
    return None


_TWO = list(tiny_worlds(2))


def test_every_tiny_world_settles() -> None:
    """Every world of two jobs, each set of tenants, one node and two, every policy."""
    assert _first_cycle(_TWO) is None, len(_TWO)


def test_the_tiny_worlds_find_a_cycle_under_the_legacy_rights() -> None:
    assert _first_cycle(_TWO, LEGACY_RIGHTS) is not None


def test_the_tiny_worlds_find_a_planted_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation: the policy's right reaches jobs of any priority (the rights by standing
    otherwise)."""
    monkeypatch.setattr(candidates, "policy_ceiling", lambda rights, priority: 1 << 62)
    found = _first_cycle(_TWO)
    assert found is not None and found.policy in ("srtf", "tiresias")


_TENANTS = st.sampled_from(
    [
        (("a", None, None), ("b", None, None), ("c", None, None)),
        (("a", 0, 8), ("b", 4, 0), ("c", 2, 6)),
        (("a", 2, 4), ("b", 2, 4), ("c", 2, 4)),
        (("a", 4, 0), ("b", 0, 12), ("c", 4, 4)),
    ]
)
_SPECS = st.builds(
    Spec,
    tenant=st.sampled_from("abc"),
    workers=st.integers(1, 3),
    gpus=st.sampled_from([1, 2, 4]),
    priority=st.sampled_from([100, 200, 300]),
    preemptible=st.booleans(),
    service=st.sampled_from([0.0, 10.0, 100.0]),
    length=st.sampled_from([50.0, 150.0, 500.0]),
)
_WORLDS = st.builds(
    World,
    nodes=st.integers(1, 3),
    gpus_per_node=st.sampled_from([2, 4]),
    tenants=_TENANTS,
    jobs=st.lists(_SPECS, min_size=2, max_size=6).map(tuple),
    policy=st.sampled_from(POLICIES),
)


@settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(_WORLDS)
def test_worlds_beyond_the_tiny_ones_settle(world: World) -> None:
    """Up to 3 tenants, 3 nodes and 6 jobs (gangs of up to 12 GPUs)."""
    assert cycle_of(world) is None, row("found", world)


# -- the protections against thrashing, with the clock moving ------------------------------------

# A third of the worlds of two jobs and a 35th of those of three (the preemptive policies):
# about 5,000 worlds, 16 cycles each (a few seconds).
_SAMPLE = [
    *_TWO[::3],
    *list(tiny_worlds(3, ("priority", "srtf", "tiresias")))[::35],
]


def test_no_tiny_world_preempts_a_protected_run() -> None:
    """The sample, the clock moving: no run younger than its minimum is preempted by another
    tenant or the policy's right, and no job preempted before is preempted younger than its
    cool-down (3 s and 5 s, as long as Tiresias' thresholds and SRTF's lengths are short).
    With nothing finishing a preempted job seldom runs again, so the cool-down's own attack is
    in tests/unit/test_preemption_protection.py; removing the minimum fails this at once."""
    for world in _SAMPLE:
        found = early_preemptions(world, 3.0, 5.0, steps=16)
        assert not found, (row("found", world), found)


def test_without_the_protections_the_checker_finds_early_preemptions() -> None:
    assert any(early_preemptions(world, 3.0, 5.0, 16, protect=False) for world in _SAMPLE)
