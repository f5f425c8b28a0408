"""Canary analysis: one pure verdict per look at a canary step (no I/O, no wall clock).

The rule (also in docs/serving.md, "Canary rollouts and drift"):

1. **Early rollback** — at any time during the interval, once the canary has answered at least
   ``min_requests`` requests in this step and the *lower* bound of the Wilson 95% interval of
   its error rate exceeds ``max_error_rate``: the evidence that the version is worse than allowed
   is conclusive, so waiting for the interval to end would only hurt more traffic.
2. **Hold** — while the interval is not over.
3. **Hold** — at the end of the interval with fewer than ``min_requests`` requests: too little
   evidence either way; the step is held until enough traffic has been seen.
4. **Rollback** — at the end of the interval if the point estimate ``errors / requests`` exceeds
   ``max_error_rate`` or the p99 latency exceeds ``max_p99_ms``.
5. **Promote the step** otherwise.

Latency is judged only at the end of an interval: a p99 over a handful of requests is one
request's latency, not evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "MIN_REQUESTS",
    "Thresholds",
    "Verdict",
    "WindowStats",
    "judge",
    "wilson_interval",
]

#: Requests the canary must answer in a step before any verdict other than "hold".
MIN_REQUESTS = 20
#: The normal quantile of a two-sided 95% interval.
Z_95 = 1.959963984540054

Action = Literal["promote_step", "hold", "rollback"]


@dataclass(frozen=True)
class Thresholds:
    """A rollout's health limits: error rate as a fraction (0.01 = 1%), p99 in milliseconds."""

    max_error_rate: float
    max_p99_ms: float
    min_requests: int = MIN_REQUESTS

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_error_rate <= 1.0:
            raise ValueError(f"max_error_rate must be in [0, 1], got {self.max_error_rate}")
        if not self.max_p99_ms > 0:
            raise ValueError(f"max_p99_ms must be positive, got {self.max_p99_ms}")
        if self.min_requests < 1:
            raise ValueError(f"min_requests must be at least 1, got {self.min_requests}")


@dataclass(frozen=True)
class WindowStats:
    """The canary version's requests, errors and p99 latency since its step started."""

    requests: int
    errors: int
    p99_ms: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.errors <= self.requests:
            raise ValueError(f"need 0 <= errors <= requests, got {self.errors}/{self.requests}")


@dataclass(frozen=True)
class Verdict:
    """What to do with the step, why (a sentence), and the figures that justified it."""

    action: Action
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


def wilson_interval(errors: int, requests: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion: (lower, upper), both within [0, 1].

    Chosen over the normal approximation because it stays inside [0, 1] and is well behaved for
    small samples and proportions near 0, exactly where a canary's error rate lives.
    """
    if requests <= 0:
        return 0.0, 1.0
    p = errors / requests
    z2 = z * z
    centre = p + z2 / (2 * requests)
    spread = z * math.sqrt(p * (1 - p) / requests + z2 / (4 * requests * requests))
    denominator = 1 + z2 / requests
    lower = max(0.0, (centre - spread) / denominator)
    upper = min(1.0, (centre + spread) / denominator)
    # Rounding can put a bound a hair past the estimate at p = 0 or 1.
    return min(lower, p), max(upper, p)


def judge(
    thresholds: Thresholds, window: WindowStats, elapsed_s: float, interval_s: float
) -> Verdict:
    """The verdict on a canary step after ``elapsed_s`` of its ``interval_s`` (pure)."""
    rate = window.errors / window.requests if window.requests else 0.0
    lower, upper = wilson_interval(window.errors, window.requests)
    figures: dict[str, Any] = {
        "requests": window.requests,
        "errors": window.errors,
        "error_rate": round(rate, 6),
        "error_rate_95": [round(lower, 6), round(upper, 6)],
        "p99_ms": window.p99_ms,
        "elapsed_s": round(elapsed_s, 3),
        "interval_s": interval_s,
        "max_error_rate": thresholds.max_error_rate,
        "max_p99_ms": thresholds.max_p99_ms,
    }
    enough = window.requests >= thresholds.min_requests
    if enough and lower > thresholds.max_error_rate:
        return Verdict(
            "rollback",
            f"error rate {_pct(rate)} ({window.errors}/{window.requests}; at least "
            f"{_pct(lower)} with 95% confidence) is over the maximum "
            f"{_pct(thresholds.max_error_rate)}",
            figures,
        )
    if elapsed_s < interval_s:
        return Verdict(
            "hold",
            f"interval not over ({elapsed_s:.1f} s of {interval_s:g} s; "
            f"{window.requests} requests, {window.errors} errors)",
            figures,
        )
    if not enough:
        return Verdict(
            "hold",
            f"too few requests to judge ({window.requests} of {thresholds.min_requests})",
            figures,
        )
    if rate > thresholds.max_error_rate:
        return Verdict(
            "rollback",
            f"error rate {_pct(rate)} ({window.errors}/{window.requests}) is over the maximum "
            f"{_pct(thresholds.max_error_rate)}",
            figures,
        )
    if window.p99_ms is not None and window.p99_ms > thresholds.max_p99_ms:
        return Verdict(
            "rollback",
            f"p99 latency {window.p99_ms:.1f} ms is over the maximum {thresholds.max_p99_ms:g} ms",
            figures,
        )
    return Verdict(
        "promote_step",
        f"healthy: error rate {_pct(rate)} ({window.errors}/{window.requests}), p99 "
        f"{_ms(window.p99_ms)} over {elapsed_s:.1f} s",
        figures,
    )


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.2f}%"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"
