"""The canary verdict: examples of each branch of the rule and its invariants (Hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aicluster.serve.canary import Thresholds, WindowStats, judge, wilson_interval

LIMITS = Thresholds(max_error_rate=0.01, max_p99_ms=500)


def test_healthy_step_is_promoted_when_the_interval_is_over() -> None:
    verdict = judge(LIMITS, WindowStats(100, 0, 40.0), elapsed_s=30, interval_s=30)
    assert verdict.action == "promote_step"
    assert verdict.figures["requests"] == 100


def test_step_holds_until_the_interval_is_over() -> None:
    verdict = judge(LIMITS, WindowStats(100, 0, 40.0), elapsed_s=29.9, interval_s=30)
    assert verdict.action == "hold"
    assert "interval not over" in verdict.reason


def test_step_holds_with_too_few_requests() -> None:
    verdict = judge(LIMITS, WindowStats(19, 0, 10.0), elapsed_s=60, interval_s=30)
    assert verdict.action == "hold"
    assert "too few requests" in verdict.reason


def test_conclusive_errors_roll_back_before_the_interval_ends() -> None:
    # 10% errors over 30 requests: the Wilson lower bound (~3.5%) is well over 1%.
    verdict = judge(LIMITS, WindowStats(30, 3, 10.0), elapsed_s=1, interval_s=30)
    assert verdict.action == "rollback"
    assert "95% confidence" in verdict.reason
    assert verdict.figures["error_rate_95"][0] > 0.01


def test_inconclusive_errors_wait_then_roll_back_on_the_point_estimate() -> None:
    # 1 error in 30: the lower bound (~0.6%) is under 1%, so no early verdict...
    window = WindowStats(30, 1, 10.0)
    assert judge(LIMITS, window, elapsed_s=5, interval_s=30).action == "hold"
    # ...but at the end, 3.3% > 1%.
    verdict = judge(LIMITS, window, elapsed_s=30, interval_s=30)
    assert verdict.action == "rollback"
    assert "3.33%" in verdict.reason


def test_slow_canary_is_rolled_back_at_the_end_of_the_interval() -> None:
    window = WindowStats(100, 0, 900.0)
    assert judge(LIMITS, window, elapsed_s=10, interval_s=30).action == "hold"
    verdict = judge(LIMITS, window, elapsed_s=30, interval_s=30)
    assert verdict.action == "rollback"
    assert "p99 latency 900.0 ms" in verdict.reason


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="max_error_rate"):
        Thresholds(max_error_rate=1.5, max_p99_ms=10)
    with pytest.raises(ValueError, match="max_p99_ms"):
        Thresholds(max_error_rate=0.1, max_p99_ms=0)
    with pytest.raises(ValueError, match="errors <= requests"):
        WindowStats(3, 4)


def test_wilson_interval_known_value() -> None:
    lower, upper = wilson_interval(2, 20)
    assert lower == pytest.approx(0.0279, abs=1e-4)
    assert upper == pytest.approx(0.3010, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


windows = st.integers(0, 5000).flatmap(
    lambda n: st.builds(
        WindowStats,
        st.just(n),
        st.integers(0, n),
        st.one_of(st.none(), st.floats(0, 5000, allow_nan=False)),
    )
)
limits = st.builds(
    Thresholds,
    st.floats(0, 1, allow_nan=False),
    st.floats(1, 2000, allow_nan=False),
    st.integers(1, 100),
)
times = st.floats(0, 1000, allow_nan=False)


@given(st.integers(0, 10_000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_contains_the_estimate(case: tuple[int, int]) -> None:
    errors, requests = case
    lower, upper = wilson_interval(errors, requests)
    assert 0.0 <= lower <= upper <= 1.0
    if requests:
        assert lower <= errors / requests <= upper


@given(limits, windows, times, times)
def test_never_promotes_early_or_unhealthy(
    thresholds: Thresholds, window: WindowStats, elapsed: float, interval: float
) -> None:
    verdict = judge(thresholds, window, elapsed, interval)
    if verdict.action == "promote_step":
        assert elapsed >= interval
        assert window.requests >= thresholds.min_requests
        assert window.errors <= thresholds.max_error_rate * window.requests
        assert window.p99_ms is None or window.p99_ms <= thresholds.max_p99_ms


@given(limits, windows, times, times)
def test_rollback_needs_evidence(
    thresholds: Thresholds, window: WindowStats, elapsed: float, interval: float
) -> None:
    verdict = judge(thresholds, window, elapsed, interval)
    if verdict.action == "rollback":
        assert window.requests >= thresholds.min_requests
        slow = window.p99_ms is not None and window.p99_ms > thresholds.max_p99_ms
        assert window.errors > thresholds.max_error_rate * window.requests or slow
        if elapsed < interval:  # early: errors only, never latency
            assert window.errors > thresholds.max_error_rate * window.requests


@given(limits, windows, times, times)
def test_more_errors_never_turn_a_rollback_into_a_promotion(
    thresholds: Thresholds, window: WindowStats, elapsed: float, interval: float
) -> None:
    if judge(thresholds, window, elapsed, interval).action != "rollback":
        return
    if window.errors < window.requests:
        worse = WindowStats(window.requests, window.errors + 1, window.p99_ms)
        assert judge(thresholds, worse, elapsed, interval).action == "rollback"


@given(limits, st.integers(1, 5000), times)
def test_an_error_free_fast_canary_is_promoted_after_the_interval(
    thresholds: Thresholds, requests: int, interval: float
) -> None:
    window = WindowStats(requests, 0, thresholds.max_p99_ms / 2)
    action = judge(thresholds, window, interval, interval).action
    assert action == ("promote_step" if requests >= thresholds.min_requests else "hold")
