"""Drift math: the Jensen–Shannon distance, reference bins, the sliding window, crossings."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aicluster.core import ManualClock
from aicluster.serve.drift import DriftMonitor, Reference, js_distance

TEXT = "the quick brown fox jumps over the lazy dog " * 20
VOCAB = sorted(set(TEXT))
CATEGORICAL = {
    "feature": "prompt",
    "kind": "categorical",
    "categories": VOCAB,
    "reference": [TEXT.count(c) / len(TEXT) for c in VOCAB],
}


def monitor(
    drift: dict[str, Any] | None = CATEGORICAL, **options: Any
) -> tuple[DriftMonitor, ManualClock]:
    clock = ManualClock(1000.0)
    settings: dict[str, Any] = {"sample_every": 1, "min_samples": 200, "threshold": 0.3}
    settings.update(options)
    return DriftMonitor(lambda t, n, v: drift, clock, **settings), clock


def test_js_distance_known_values() -> None:
    assert js_distance([1, 0], [1, 0]) == 0
    assert js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    # JSD([.5,.5],[1,0]) = 1 - 0.75*log2(1/0.75)... computed by hand: 0.3113 bits.
    assert js_distance([1, 1], [1, 0]) == pytest.approx(math.sqrt(0.311278), abs=1e-5)
    with pytest.raises(ValueError, match="empty"):
        js_distance([0, 0], [1, 1])
    # The smallest subnormal against 0: their mean underflows to 0 (Hypothesis found it).
    assert js_distance([5e-324, 1.0], [0.0, 1.0]) == 0


histograms = st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=20)


@given(
    histograms.flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.lists(st.floats(0, 100, allow_nan=False), min_size=len(p), max_size=len(p)),
        )
    )
)
def test_js_distance_is_a_bounded_symmetric_metric(pair: tuple[list[float], list[float]]) -> None:
    p, q = pair
    if sum(p) <= 0 or sum(q) <= 0:
        return
    d = js_distance(p, q)
    assert 0 <= d <= 1
    assert d == pytest.approx(js_distance(q, p), abs=1e-9)
    assert js_distance(p, p) == pytest.approx(0, abs=1e-6)


def test_categorical_reference_counts_characters_and_unseen_ones() -> None:
    ref = Reference.from_meta(CATEGORICAL)
    bins = list(ref.bins("thé"))
    assert bins[:2] == [VOCAB.index("t"), VOCAB.index("h")]
    assert bins[2] == len(VOCAB)  # the "other" bin, reference 0
    assert ref.proportions[-1] == 0


def test_numeric_reference_accepts_inner_or_outer_edges() -> None:
    outer = Reference.from_meta(
        {"feature": "x", "kind": "numeric", "edges": [0, 1, 2, 3], "reference": [0.2, 0.5, 0.3]}
    )
    inner = Reference.from_meta(
        {"feature": "x", "kind": "numeric", "edges": [1, 2], "reference": [0.2, 0.5, 0.3]}
    )
    for ref in (outer, inner):
        assert list(ref.bins([-5, 0.5, 1.5, [2.5, 99], "x", float("nan")])) == [0, 0, 1, 2, 2]


@pytest.mark.parametrize(
    "bad",
    [
        {"feature": "x", "kind": "numeric", "edges": [2, 1], "reference": [0.2, 0.5, 0.3]},
        {"feature": "x", "kind": "categorical", "categories": ["a"], "reference": [0.5, 0.5]},
        {"feature": "x", "kind": "other", "reference": [1]},
        {"kind": "categorical", "categories": ["a"], "reference": [1]},
    ],
)
def test_bad_references_are_refused_readably(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="drift"):
        Reference.from_meta(bad)


def test_in_distribution_scores_low_and_shifted_scores_high() -> None:
    rng = random.Random(7)
    same, _ = monitor()
    shifted, _ = monitor()
    for _ in range(100):
        start = rng.randrange(len(TEXT) - 40)
        same("t", "m", 1, {"prompt": TEXT[start : start + 40]})
        shifted("t", "m", 1, {"prompt": "ZZZZ 1234 !!!! qqqq " * 2})
    low = same.scores()[("t", "m", 1)]
    high = shifted.scores()[("t", "m", 1)]
    assert low < 0.15 < 0.6 < high


def test_no_score_before_min_samples_and_sampling_one_in_k() -> None:
    drift, _ = monitor(sample_every=4, min_samples=100)
    for _ in range(12):
        drift("t", "m", 1, {"prompt": "a" * 10})
    assert drift.scores() == {}  # 3 samples of 10 characters
    for _ in range(40):
        drift("t", "m", 1, {"prompt": "a" * 10})
    assert sum(1 for _ in drift.scores()) == 1


def test_the_window_slides() -> None:
    drift, clock = monitor(window_s=100, buckets=10, min_samples=50)
    drift("t", "m", 1, {"prompt": "Z" * 100})
    assert drift.scores()[("t", "m", 1)] > 0.9
    clock.advance(101)
    assert drift.scores() == {}  # the old bucket fell out of the window


def test_crossings_are_reported_once_each_way() -> None:
    drift, clock = monitor(window_s=100, buckets=10, min_samples=50)
    events: list[tuple[str, str, dict[str, Any]]] = []
    drift("t", "m", 1, {"prompt": "Z" * 100})
    for _ in range(3):
        drift.tick(lambda *event: events.append(event))
    assert [kind for _, kind, _ in events] == ["model.drift"]
    assert events[0][0] == "t"
    assert events[0][2]["score"] > 0.9 and events[0][2]["version"] == 1
    clock.advance(101)
    drift("t", "m", 1, {"prompt": TEXT})
    drift.tick(lambda *event: events.append(event))
    drift.tick(lambda *event: events.append(event))
    assert [kind for _, kind, _ in events] == ["model.drift", "model.drift_cleared"]


def test_versions_without_reference_and_bad_inputs_are_ignored() -> None:
    drift, _ = monitor(drift=None)
    drift("t", "m", 1, {"prompt": "abc"})
    drift("t", "m", 1, "not a mapping")
    assert drift.scores() == {}
    samples = next(iter(drift.collect())).samples
    assert samples == []


def test_gauge_is_exported_per_version() -> None:
    drift, _ = monitor(min_samples=10)
    drift("acme", "gpt", 3, {"prompt": TEXT})
    (family,) = list(drift.collect())
    assert family.name == "aicluster_model_drift_score"
    (sample,) = family.samples
    assert sample.labels == {"tenant": "acme", "model": "gpt", "version": "3"}
    assert sample.value < 0.2
