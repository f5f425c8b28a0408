"""Synchronization jitter and straggler math on synthetic telemetry, and the step timing shim's
accounting of collective wait (with a fake clock: the one boundary faked)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from aicluster.control.loop.health import GangMonitor, HealthConfig, sync_jitter
from aicluster.train.telemetry import StepRecord

SHIM = Path(__file__).resolve().parents[2] / "src/aicluster/runtime/gang/_steptime.py"


def _shim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("steptime_under_test", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jitter_is_the_median_spread_and_a_node_carries_its_slowest_rank() -> None:
    steps = {
        1: {0: 0.10, 1: 0.11, 2: 0.30, 3: 0.10},
        2: {0: 0.10, 1: 0.10, 2: 0.32, 3: 0.12},
        3: {0: 0.11, 1: 0.10, 2: 0.31, 3: 0.10},
    }
    nodes = {0: "a", 1: "a", 2: "b", 3: "b"}
    jitter = sync_jitter(steps, nodes, window=10)
    assert jitter is not None
    assert jitter.job == pytest.approx(0.21)  # spreads 0.20, 0.22, 0.21
    assert jitter.nodes["b"] == pytest.approx(0.21)  # rank 2 minus the fastest
    assert jitter.nodes["a"] == pytest.approx(0.01)  # spreads 0.01, 0.00, 0.01
    assert jitter.steps == 3 and jitter.last_step == 3


def test_jitter_uses_only_the_latest_window_of_steps() -> None:
    steps = {s: {0: 0.1, 1: 0.1 + (1.0 if s <= 5 else 0.0)} for s in range(1, 16)}
    jitter = sync_jitter(steps, {0: "a", 1: "b"}, window=10)
    assert jitter is not None and jitter.job == pytest.approx(0.0)
    assert jitter.steps == 10 and sync_jitter({}, {}, window=10) is None


def feed(monitor: GangMonitor, steps: int, compute: dict[int, float], seed: int = 0) -> int | None:
    """Every rank reports ``steps`` steps (±5% noise); the step of the first flag."""
    rng = random.Random(seed)
    first = None
    for step in range(1, steps + 1):
        for rank, seconds in compute.items():
            took = seconds * rng.uniform(0.95, 1.05)
            record = StepRecord(
                "step",
                rank,
                float(step),
                step=step,
                step_time=0.25,
                node=f"node-{rank}",
                metrics={"compute_time": took},
            )
            if monitor.observe([record]) and first is None:
                first = step
    return first


def test_a_rank_slowed_by_a_sleep_is_flagged_with_its_node_and_step_within_20_steps() -> None:
    # What the shim reports for DDP with rank 1 sleeping 0.2 s: rank 0 waits, rank 1 computes.
    monitor = GangMonitor(workers=2, started_at=0.0)
    first = feed(monitor, 40, {0: 0.002, 1: 0.202})
    assert first is not None and first <= 20
    (straggler,) = monitor.flagged.values()
    assert (straggler.rank, straggler.node, straggler.step) == (1, "node-1", first)
    assert monitor.jitter is not None and monitor.jitter.job == pytest.approx(0.2, rel=0.1)
    assert monitor.jitter.nodes["node-0"] == pytest.approx(0.0, abs=0.001)
    assert monitor.jitter.nodes["node-1"] == pytest.approx(0.2, rel=0.1)


def test_millisecond_differences_are_never_a_straggler() -> None:
    # 3x slower but by 2 ms: below straggler_min_s, noise of a tiny model.
    monitor = GangMonitor(workers=2, started_at=0.0)
    assert feed(monitor, 100, {0: 0.001, 1: 0.003}) is None
    loose = GangMonitor(workers=2, started_at=0.0, config=HealthConfig(straggler_min_s=0.0))
    assert feed(loose, 100, {0: 0.001, 1: 0.003}) is not None


def test_one_rank_has_no_jitter() -> None:
    monitor = GangMonitor(workers=1, started_at=0.0)
    feed(monitor, 20, {0: 0.1})
    assert monitor.jitter is None


def test_the_monitor_keeps_a_bounded_number_of_steps() -> None:
    monitor = GangMonitor(workers=2, started_at=0.0)
    feed(monitor, 2000, {0: 0.1, 1: 0.1})
    assert len(monitor.by_step) <= 8 * monitor.config.straggler_window
    assert monitor.jitter is not None and monitor.jitter.last_step == 2000


def test_collective_wait_is_the_time_a_collective_was_in_flight() -> None:
    shim = _shim()
    assert shim.union_seconds([(1.0, 2.0), (1.5, 2.5), (3.0, 3.2)], 0.0, 10.0) == pytest.approx(1.7)
    assert shim.union_seconds([(0.0, 2.0)], 1.0, 1.5) == pytest.approx(0.5)  # clipped
    now = [100.0]
    written: list[dict[str, Any]] = []
    clock = shim.StepClock(written.append, lambda: now[0])
    first = clock.boundary()
    assert first == {"kind": "step", "step": 1}  # no time: it would count the start-up
    clock.collective(100.1, 100.3)  # overlapping buckets count once
    clock.collective(100.2, 100.4)
    now[0] = 100.5
    second = clock.boundary()
    assert second["step"] == 2 and second["step_time"] == pytest.approx(0.5)
    assert second["metrics"]["comm_wait"] == pytest.approx(0.3)
    assert second["metrics"]["compute_time"] == pytest.approx(0.2)
    assert written == [first, second]


def test_the_shim_merges_intervals_past_its_cap() -> None:
    shim = _shim()
    clock = shim.StepClock(lambda record: None, lambda: 0.0)
    clock.boundary()
    for i in range(shim.MAX_INTERVALS + 10):
        clock.collective(i * 0.001, i * 0.001 + 0.0005)
    assert len(clock._intervals) <= shim.MAX_INTERVALS + 1


def test_a_step_reports_the_bytes_handed_to_collectives_during_it() -> None:
    shim = _shim()
    clock = shim.StepClock(lambda record: None, iter([0.0, 1.0, 2.0]).__next__)
    clock.boundary()
    clock.sent(4096)
    clock.sent(100)
    assert clock.boundary()["metrics"]["comm_bytes"] == 4196
    assert clock.boundary()["metrics"]["comm_bytes"] == 0
    assert clock.bytes == 4196  # what aicluster.train reads, since the start


def test_the_payload_of_a_collective_is_the_tensor_this_rank_hands_in() -> None:
    import torch

    shim = _shim()
    tensor = torch.zeros(10, dtype=torch.float16)
    assert shim._payload_bytes("all_reduce", (tensor,), {}) == 20
    assert shim._payload_bytes("all_reduce", (), {"tensor": tensor}) == 20
    assert shim._payload_bytes("reduce_scatter_tensor", (torch.zeros(5), tensor), {}) == 20
    assert shim._payload_bytes("barrier", (), {}) == 0
    assert shim._payload_bytes("all_reduce", ("not a tensor",), {}) == 0


def test_the_shim_says_once_that_a_rank_will_step_when_an_optimizer_is_made() -> None:
    """The first optimizer made (any later one too) writes one ``stepping`` record, after the
    optimizer's own ``__init__`` ran."""
    shim = _shim()
    written: list[dict[str, Any]] = []

    class Optimizer:
        def __init__(self, params: Any, lr: float = 0.1) -> None:
            self.lr = lr

    class SGD(Optimizer):
        def __init__(self, params: Any, lr: float = 0.2) -> None:
            super().__init__(params, lr)

    shim._patch_optimizer(Optimizer)
    SGD([])  # before install: nothing to write to
    assert written == []
    shim._clock = shim.StepClock(written.append, lambda: 0.0)
    made = SGD([], lr=0.5)
    Optimizer([])
    assert made.lr == 0.5 and SGD.__init__.__name__ == "__init__"
    assert written == [{"kind": "stepping"}]
