"""Pure parts of serving: time-bucketed statistics, the weighted version pick, scaling and
traffic validation, Serve options."""

from __future__ import annotations

import random

import pytest

from aicluster.serve import Route, ServingStats, app_name
from aicluster.serve.replica import deployment_options, fingerprint
from aicluster.serve.stats import KEEP_S
from aicluster.store.serving import DeploymentRecord, check_scaling, check_traffic


class Sink:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, float, bool, int]] = []

    def observe(
        self, tenant: str, model: str, version: str, seconds: float, ok: bool, code: int = 200
    ) -> None:
        self.seen.append((tenant, model, version, seconds, ok, code))


def test_window_counts_requests_errors_and_p99_of_its_seconds_only() -> None:
    sink = Sink()
    stats = ServingStats(sink)
    for i in range(99):
        stats.record("a", "m", 1, True, 0.010, 1000.0 + i * 0.01)
    stats.record("a", "m", 1, False, 2.0, 1000.5, code=500)
    stats.record("a", "m", 1, True, 0.010, 990.0)  # before the window
    stats.record("a", "m", 2, False, 0.010, 1000.0)  # another version
    window = stats.window("a", "m", 1, since=1000.0, now=1001.0)
    assert (window.requests, window.errors) == (100, 1)
    assert window.error_rate == pytest.approx(0.01)
    assert window.p99_ms is not None and 10.0 <= window.p99_ms <= 10.0 * 1.13
    slow = stats.window("a", "m", 1, since=990.0, now=1001.0)
    assert slow.requests == 101
    assert stats.window("a", "m", 3, since=0.0, now=2000.0).p99_ms is None
    assert sink.seen[99] == ("a", "m", "1", 2.0, False, 500)


def test_p99_follows_the_slowest_percent() -> None:
    stats = ServingStats()
    for i in range(1000):
        stats.record("a", "m", 1, True, 0.5 if i % 50 == 0 else 0.001, 10.0)
    p99 = stats.window("a", "m", 1, 10.0, 10.0).p99_ms
    assert p99 is not None and 500.0 <= p99 <= 500.0 * 1.13


def test_old_buckets_are_reused_not_counted() -> None:
    stats = ServingStats()
    stats.record("a", "m", 1, False, 0.01, 100.0)
    stats.record("a", "m", 1, True, 0.01, 100.0 + KEEP_S)  # the same slot, KEEP_S later
    window = stats.window("a", "m", 1, since=0.0, now=100.0 + KEEP_S)
    assert (window.requests, window.errors) == (1, 0)
    stats.forget("a", "m")
    assert stats.window("a", "m", 1, 0.0, 100.0 + KEEP_S).requests == 0


def _record(traffic: dict[int, float]) -> DeploymentRecord:
    return DeploymentRecord(1, "a", "m", {"replicas": 1}, traffic, "active", "u", 0, 0, 1)


def test_route_picks_versions_by_weight_and_never_a_zero_weight_one() -> None:
    route = Route.of(_record({1: 90.0, 2: 10.0, 3: 0.0}))
    rng = random.Random(1)
    picks = [route.pick(rng.random()) for _ in range(10_000)]
    assert 3 not in picks
    assert 800 <= picks.count(2) <= 1200
    assert route.pick(0.0) == 1 and route.pick(0.999999) == 2


def test_scaling_and_traffic_are_validated() -> None:
    assert check_scaling({"replicas": 3}) == {"replicas": 3}
    auto = check_scaling({"autoscaling": {"min": 0, "max": 4, "target_ongoing_requests": 2}})
    assert auto["autoscaling"] == {"min": 0, "max": 4, "target_ongoing_requests": 2.0}
    for bad in ({"replicas": 0}, {"autoscaling": {"min": 3, "max": 2}}, {"replicas": 65}):
        with pytest.raises(ValueError):
            check_scaling(bad)
    assert check_traffic({"1": 90, "2": 10}) == {1: 90.0, 2: 10.0}
    for wrong in ({}, {1: 50}, {1: 110, 2: -10}, {0: 100}, {1: float("nan")}):
        with pytest.raises(ValueError):
            check_traffic(wrong)


def test_bare_serve_options_and_fingerprint_ignores_promotion() -> None:
    options = deployment_options({"replicas": 2})  # a plain Serve deployment (the benchmark's)
    assert options["num_replicas"] == 2 and "max_replicas_per_node" not in options
    assert options["ray_actor_options"] == {"num_cpus": 1.0}
    assert "autoscaling_config" not in options  # the service scaler scales, never Serve
    plain = fingerprint("/m/1", {"replicas": 2})
    assert plain == fingerprint("/m/1", {"replicas": 2, "promote_when_healthy": 3})
    assert plain != fingerprint("/m/1", {"replicas": 3})
    assert app_name("team-a", "my.model", 3) == "aic-team-a.my~2emodel.v3"
    assert app_name("team-a", "m", 1) != app_name("team_a", "m", 1)  # tests/unit/test_names.py
