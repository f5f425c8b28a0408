"""Power saving's state machine (scheduler/power.py), driven as both loops drive it: through
effects.power_step after each cycle and at the times it asks for."""

import pytest

from aicluster.configuration import parse_configuration, scheduler_config
from aicluster.core import ConfigError, GpuPower
from aicluster.core.power import PowerPolicy, PowerState
from aicluster.scheduler import effects
from builders import Driver, admitted, make_job, small_cluster

POLICY = PowerPolicy(suspend_after=100, suspend_time=10, resume_time=50)


def _states(driver: Driver) -> list[PowerState]:
    power = driver.state.power
    assert power is not None
    return [power.state_of(i) for i in range(len(driver.state.index.nodes))]


def _step(driver: Driver, at: float) -> list[tuple[str, str]]:
    driver.now = at
    return [(t.node, t.after.value) for t in effects.power_step(driver.state, at)]


def test_idle_nodes_power_down_after_suspend_after_and_stop_drawing() -> None:
    driver = Driver(small_cluster(nodes=2, power=GpuPower(node_watts=100)), power=POLICY)
    index = driver.state.index
    assert index.watts == 2 * (100 + 8 * 60)
    assert _step(driver, 99) == []
    assert _step(driver, 100) == [("node-0", "suspending"), ("node-1", "suspending")]
    assert index.watts == 2 * (100 + 8 * 60)  # still drawing while it shuts down
    assert not any(index.schedulable)
    assert _step(driver, 110) == [("node-0", "off"), ("node-1", "off")]
    assert index.watts == 0
    power = driver.state.power
    assert power is not None and power.next_due(110) is None


def test_a_node_holding_work_is_never_powered_down() -> None:
    driver = Driver(small_cluster(nodes=2), power=POLICY)
    driver.submit(make_job("a").gpus(8))
    driver.cycle()
    _step(driver, 500)
    _step(driver, 510)
    busy = driver.node_of("a")[0]
    assert _states(driver)[driver.state.index.node_id[busy]] is PowerState.ON
    driver.finish("a", at=600)
    assert _step(driver, 699) == []
    assert _step(driver, 700) == [(busy, "suspending")]


@pytest.mark.parametrize(
    ("floors", "left_on"), [({"min_nodes_on": 3}, 3), ({"min_nodes_on_per_rack": 1}, 2)]
)
def test_floors_keep_nodes_on(floors: dict[str, int], left_on: int) -> None:
    policy = PowerPolicy(suspend_after=100, suspend_time=10, resume_time=50, **floors)
    driver = Driver(small_cluster(nodes=4, per_rack=2), power=policy)
    _step(driver, 100)
    _step(driver, 110)
    assert _states(driver).count(PowerState.IDLE) == left_on
    if "min_nodes_on_per_rack" in floors:  # one in each rack
        on = [i for i, s in enumerate(_states(driver)) if s is PowerState.IDLE]
        assert sorted(driver.state.index.node_rack[i] for i in on) == [0, 1]


def _all_off(nodes: int = 2) -> Driver:
    driver = Driver(small_cluster(nodes=nodes), power=POLICY)
    _step(driver, 100)
    _step(driver, 110)
    return driver


def test_the_queue_resumes_off_nodes_and_its_job_runs_once_they_are_up() -> None:
    driver = _all_off()
    driver.submit(make_job("gang").workers(2, gpus_per_worker=8))
    assert admitted(driver.cycle(at=200)) == []
    assert _step(driver, 200) == [("node-0", "resuming"), ("node-1", "resuming")]
    power = driver.state.power
    assert power is not None and power.next_due(200) == 250
    assert power.resuming_for("H100") == (2, 250)
    assert _step(driver, 250) == [("node-0", "on"), ("node-1", "on")]
    assert admitted(driver.cycle(at=250)) == ["gang"]
    assert _states(driver) == [PowerState.ON, PowerState.ON]


def test_only_as_many_nodes_resume_as_the_queue_needs() -> None:
    driver = _all_off(nodes=4)
    driver.submit(make_job("small").gpus(4))
    driver.cycle(at=200)
    assert _step(driver, 200) == [("node-0", "resuming")]


def test_a_resume_that_fails_sends_the_job_to_another_node() -> None:
    driver = _all_off()
    driver.submit(make_job("a").gpus(8))
    driver.cycle(at=200)
    assert _step(driver, 200) == [("node-0", "resuming")]
    failed = effects.resume_failed(driver.state, "node-0", 220)
    assert failed.after is PowerState.FAILED
    assert _step(driver, 220) == [("node-1", "resuming")]
    _step(driver, 270)
    assert admitted(driver.cycle(at=270)) == ["a"]
    assert driver.node_of("a") == ("node-1",)
    assert not driver.state.index.schedulable[0]


def test_waiting_jobs_keep_idle_nodes_of_their_type_on() -> None:
    driver = Driver(small_cluster(nodes=2), power=POLICY)
    driver.occupy("busy", "node-0", 4)
    driver.submit(make_job("wide").gpus(16))  # cannot fit while busy runs
    driver.cycle()
    assert _step(driver, 1000) == []


def test_a_repaired_node_that_is_off_stays_off() -> None:
    driver = _all_off()
    effects.node_down(driver.state, "node-0", 120)
    effects.node_up(driver.state, "node-0", 130)
    assert not driver.state.index.schedulable[0]
    assert _states(driver)[0] is PowerState.OFF


def test_the_configuration_section_and_the_old_name() -> None:
    text = "power:\n  suspend_after_s: 600\n  min_nodes_on: 2\n"
    config = scheduler_config(parse_configuration(text)[0])
    assert config.power == PowerPolicy(suspend_after=600, min_nodes_on=2)
    assert scheduler_config(parse_configuration("policy: {name: fifo}\n")[0]).power is None
    with pytest.raises(ConfigError, match=r":1: power: energy_aware was replaced by suspend_after"):
        parse_configuration("power:\n  energy_aware: true\n")


def test_a_job_waiting_for_resumed_nodes_says_so_with_the_time() -> None:
    driver = _all_off()
    driver.submit(make_job("gang").workers(2, gpus_per_worker=8))
    driver.cycle(at=200)
    _step(driver, 200)
    reason = driver.cycle(at=210).reason_for("gang")
    assert reason is not None
    assert "2 node(s) resuming from power saving, up in 40 s" in reason.message


def test_transitions_name_the_state_left() -> None:
    driver = Driver(small_cluster(nodes=1), power=POLICY)
    (change,) = effects.power_step(driver.state, 100)
    assert (change.before, change.after, change.done_at) == (
        PowerState.IDLE,
        PowerState.SUSPENDING,
        110,
    )


def test_an_old_file_whose_power_keys_say_nothing_still_reads() -> None:
    old = "power:\n  energy_aware: false\n  power_cap_watts: null\n"
    assert scheduler_config(parse_configuration(old)[0]).power is None
    with pytest.raises(ConfigError, match="power_cap_watts moved to the cluster file"):
        parse_configuration("power:\n  energy_aware: false\n  power_cap_watts: 5\n")


# -- live: suspends and resumes end when confirmed (control/loop/power.py) ------------------------


def _live(nodes: int = 2) -> Driver:
    driver = Driver(small_cluster(nodes=nodes, power=GpuPower(node_watts=100)), power=POLICY)
    power = driver.state.power
    assert power is not None
    power.timed = False
    return driver


def test_live_a_suspend_ends_when_confirmed_not_when_its_time_has_passed() -> None:
    driver = _live()
    power = driver.state.power
    assert power is not None
    assert _step(driver, 100) == [("node-0", "suspending"), ("node-1", "suspending")]
    assert _step(driver, 500) == []  # long past suspend_time: still suspending
    assert power.finish(0, 501).after is PowerState.OFF
    assert _states(driver) == [PowerState.OFF, PowerState.SUSPENDING]
    assert driver.state.index.watts == 100 + 8 * 60  # node-1 draws until its suspend is done


def test_live_a_failed_resume_takes_the_node_out_and_the_queue_resumes_another() -> None:
    driver = _live(nodes=3)
    power = driver.state.power
    assert power is not None
    _step(driver, 100)
    for i in range(3):
        power.finish(i, 101)
    driver.submit(make_job("one").gpus(8))
    assert admitted(driver.cycle(at=200)) == []
    assert _step(driver, 200) == [("node-0", "resuming")]
    assert power.resume_failed(0, 230).after is PowerState.FAILED
    assert _step(driver, 231) == [("node-1", "resuming")]  # the job's demand, elsewhere
    power.finish(1, 260)
    assert admitted(driver.cycle(at=260)) == ["one"]
    assert driver.node_of("one") == ("node-1",)
    assert not driver.state.index.schedulable[0]
    assert power.recovered(0, 300).after is PowerState.ON  # mended: idle and schedulable
    assert power.state_of(0) is PowerState.IDLE and driver.state.index.schedulable[0]


def test_live_a_rebuilt_manager_starts_from_the_recorded_states() -> None:
    driver = _live(nodes=4)
    power = driver.state.power
    assert power is not None
    recorded = [PowerState.ON, PowerState.OFF, PowerState.RESUMING, PowerState.FAILED]
    for i, state in enumerate(recorded):
        power.restore(i, state, 150.0 if state is PowerState.RESUMING else None, 100.0)
    assert _states(driver) == [PowerState.IDLE, *recorded[1:]]
    assert list(driver.state.index.schedulable) == [True, False, False, False]
    assert power.on_count == 2  # node-0 and the resuming node-2
    assert power.resuming_for("H100") == (1, 150.0)
    assert power.finish(2, 120).after is PowerState.ON
    assert driver.state.index.schedulable[2]
