"""The data-locality term changes nothing where no data is cached for a job (Hypothesis): random
scenarios replayed with the term on, nodes reporting random cached shards, decide exactly as with
it off (placements, preemptions and the free-capacity index's layout, cycle by cycle), both for
jobs without data and for jobs whose data no node holds (every tie-break then ties)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_scheduler_properties import Scenario, replay, scenarios

from aicluster.scheduler import SchedulerConfig


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenarios(),
    st.lists(st.sampled_from(["t/a", "t/b", "u/c"]), min_size=1, max_size=3),
    st.booleans(),
    st.booleans(),
)
def test_jobs_without_cached_data_decide_as_with_the_term_off(
    scenario: Scenario, shards: list[str], shortcuts: bool, with_data: bool
) -> None:
    plain = SchedulerConfig(queue=scenario.policy, backfill=scenario.backfill, shortcuts=shortcuts)
    local = SchedulerConfig(
        queue=scenario.policy,
        backfill=scenario.backfill,
        shortcuts=shortcuts,
        placement_preferences=("data_cached_bytes",),
    )
    cached = {f"node-{i}": shards[: i + 1] for i in range(scenario.nodes) if i % 2}
    off = replay(scenario, plain, stop_rate=0.3, layout=True)
    if with_data:  # data of their own that no node caches
        jobs = [replace(job, data=(("x/none", 1 << 30),)) for job in scenario.jobs]
        scenario = replace(scenario, jobs=jobs)
    on = replay(scenario, local, stop_rate=0.3, layout=True, cached=cached)
    assert on == off
