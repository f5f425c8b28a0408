"""The scheduler configuration file: its schema, its errors, its examples and its one set of
defaults shared by the live loop and the simulator."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from aicluster.configuration import (
    Configuration,
    loop_options,
    parse_configuration,
    scheduler_config,
    sim_config,
)
from aicluster.control.loop.health import HealthConfig
from aicluster.control.settings import LoopSettings
from aicluster.core import ConfigError, Job, make_cluster
from aicluster.scheduler import SchedulerConfig, make_state, schedule
from aicluster.sim import SimConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "config").glob("*.yaml"))


def test_the_defaults_file_is_the_schemas_defaults() -> None:
    configuration, tenants = parse_configuration(
        (ROOT / "examples/config/defaults.yaml").read_text()
    )
    assert configuration == Configuration() and tenants == {}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_every_example_is_valid_and_differs_from_the_defaults(path: Path) -> None:
    configuration, _ = parse_configuration(path.read_text(), str(path))
    if path.name != "defaults.yaml":
        assert configuration != Configuration() or "tenants" in path.read_text()


def test_every_option_is_documented_and_has_an_example() -> None:
    docs = (ROOT / "docs" / "config.md").read_text()
    examples = "".join(path.read_text() for path in EXAMPLES if path.name != "defaults.yaml")

    def options(model: type, prefix: str = "") -> list[str]:
        found = []
        for name, field in model.model_fields.items():
            inner = field.annotation
            if isinstance(inner, type) and hasattr(inner, "model_fields"):
                found += options(inner, f"{prefix}{name}.")
            else:
                found.append(f"{prefix}{name}")
        return found

    for option in options(Configuration):
        assert f"`{option}`" in docs, f"{option} is not in docs/config.md"
        assert f"{option.rsplit('.', 1)[-1]}:" in examples, f"no example sets {option}"


def test_no_file_means_the_same_defaults_live_and_in_the_simulator() -> None:
    defaults = Configuration()
    assert scheduler_config(defaults) == SchedulerConfig()
    assert sim_config(defaults) == SimConfig()
    options = loop_options(defaults)
    assert options["health"] == HealthConfig()
    live = LoopSettings()  # the loop's defaults, each option's as the configuration's
    assert replace(live, scheduler=scheduler_config(defaults), **options) == live


@pytest.mark.parametrize(
    ("text", "where", "what"),
    [
        ("policy:\n  name: lottery\n", ":2", "policy.name: unknown policy 'lottery'"),
        ("policy:\n  nmae: fifo\n", ":2", "policy.nmae: Extra inputs"),
        ("backfill: conservative\n", ":1", "backfill"),
        ("preemption:\n  enabled: true\n  grace_period_s: -1\n", ":3", "grace_period_s"),
        ("policy:\n  tiresias:\n    thresholds_gpu_s: [10, 5]\n", ":3", "strictly increasing"),
        ("health:\n  restart_backoff_s: [60, 2]\n", ":2", "cannot exceed"),
        ("power:\n  power_cap_watts: 0\n", ":1", "power_cap_watts moved to the cluster file"),
        ("power:\n  suspend_after_s: 0\n", ":2", "power.suspend_after_s"),
        ("placement:\n  strategy: spread\n", ":2", "placement.strategy: Input should be"),
        (
            "simulation:\n  communication:\n    sensitivity_by_gpus: {8: 1.5}\n",
            ":3",
            "simulation.communication.sensitivity_by_gpus.8: Input should be less than or equal",
        ),
        (
            "simulation:\n  communication:\n    sensitivity_by_gpus: {0: 0.1}\n",
            ":3",
            "sensitivity_by_gpus.0.[key]: Input should be greater than or equal to 1",
        ),
        ("tenants:\n  - name: a\n    weight: 0\n", ":3", "weight"),
        ("tenants:\n  - name: a\n    cpu_quota: -2\n", ":3", "cpu_quota must be at least 0"),
        ("policy: [\n", "", "not valid YAML"),
        ("- fifo\n", ":1", "mapping at the top level"),
    ],
)
def test_a_bad_file_names_the_line_and_the_key(text: str, where: str, what: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_configuration(text, "c.yaml")
    assert f"c.yaml{where}" in str(caught.value)
    assert what in str(caught.value)


def test_tenants_seeded_from_a_file_keep_their_cpu_and_memory_caps() -> None:
    _, tenants = parse_configuration((ROOT / "examples/config/tenants.yaml").read_text())
    assert (tenants["team-b"].cpu_quota, tenants["team-b"].memory_quota_gb) == (64.0, 256.0)
    assert (tenants["team-a"].cpu_quota, tenants["team-a"].memory_quota_gb) == (None, None)


def test_the_priority_gap_limits_which_priorities_preempt_which() -> None:
    def preempted(gap: int, priority: int) -> list[str]:
        config = SchedulerConfig(queue="priority", priority_gap=gap)
        state = make_state(make_cluster(nodes=1, gpus_per_node=1), {}, config)
        state.submit(Job(id="low", tenant="t", submit_time=0.0, priority=100), 0.0)
        state.start("low", schedule(state.snapshot(0.0)).admissions[0].placement, 0.0)
        state.submit(Job(id="new", tenant="t", submit_time=1.0, priority=priority), 1.0)
        return [p.job_id for p in schedule(state.snapshot(1.0)).preemptions]

    assert preempted(1, 300) == ["low"]
    assert preempted(200, 300) == ["low"]  # exactly 200 levels below
    assert preempted(201, 300) == []
    assert preempted(201, 400) == ["low"]
    assert preempted(1, 100) == []
