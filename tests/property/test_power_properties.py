"""Power saving on random scenarios: jobs arrive, run and end while the shared state machine
(effects.power_step) suspends and resumes nodes. After every step: a node holding work is on,
only nodes that are on take work, the floors hold, and the index's draw is what its nodes'
states say."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aicluster.core import GpuPower
from aicluster.core.power import PowerPolicy, PowerState
from aicluster.scheduler import effects
from builders import Driver, make_job, small_cluster

WORKING = (PowerState.ON, PowerState.IDLE)
KEPT_ON = (PowerState.ON, PowerState.IDLE, PowerState.RESUMING)

# (wait seconds, then: submit a job of this many GPUs, or 0: end the oldest running job)
STEPS = st.lists(
    st.tuples(st.integers(0, 400), st.sampled_from([0, 0, 1, 2, 4, 8, 16])), max_size=40
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STEPS, st.integers(0, 3))
def test_power_saving_keeps_its_invariants(steps: list[tuple[int, int]], floor: int) -> None:
    policy = PowerPolicy(suspend_after=100, suspend_time=20, resume_time=60, min_nodes_on=floor)
    driver = Driver(small_cluster(nodes=4, power=GpuPower(node_watts=100)), power=policy)
    state, now = driver.state, 0.0
    for n, (wait, gpus) in enumerate(steps):
        now += wait
        driver.now = now
        if gpus:
            driver.submit(make_job(f"j{n}").gpus(gpus).at(now))
        elif state.running:
            driver.finish(next(iter(state.running)))
        effects.power_step(state, now)
        driver.cycle(at=now)
        effects.power_step(state, now)
        _check(driver, floor)


def _check(driver: Driver, floor: int) -> None:
    state, index = driver.state, driver.state.index
    power = state.power
    assert power is not None
    states = [power.state_of(i) for i in range(len(index.nodes))]
    for running in state.running.values():
        for name in running.placement.nodes:
            assert states[index.node_id[name]] is PowerState.ON
    for i, node_state in enumerate(states):
        assert index.schedulable[i] == (node_state in WORKING)
        assert index.powered_on[i] == (node_state is not PowerState.OFF)
    assert sum(s in KEPT_ON for s in states) >= min(floor, len(states))
    assert abs(index.watts - sum(index.node_watts(i) for i in range(len(states)))) < 1e-6
