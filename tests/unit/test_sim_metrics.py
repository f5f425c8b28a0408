"""Fairness definitions and the bounded time series."""

from __future__ import annotations

import math
import random

import pytest

from aicluster.core import make_cluster
from aicluster.sim import FailureModel, Series, jain_index, max_min_shares


def test_max_min_shares_fill_small_demands_and_split_the_rest_by_weight() -> None:
    assert max_min_shares([10, 100, 100], [1, 1, 1], 90) == [10, 40, 40]
    assert max_min_shares([100, 100], [1, 3], 80) == [20, 60]
    assert max_min_shares([5, 5], [1, 1], 80) == [5, 5]


def test_jain_index_bounds() -> None:
    assert jain_index([1, 1, 1, 1]) == 1
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert math.isnan(jain_index([]))


def test_series_coarsens_to_stay_bounded_and_evenly_spaced() -> None:
    series = Series(step=1.0, max_points=4, columns=("x",))
    for now in range(9):  # the engine's contract: add samples up to the current time
        while series.next_time <= now:
            series.add((float(now),))
    assert series.step == 4.0
    assert list(series.times) == [0.0, 4.0, 8.0]
    assert list(series.columns["x"]) == [0.0, 4.0, 8.0]


def test_failure_rate_follows_gpus() -> None:
    cluster = make_cluster(nodes=2048)  # 16,384 GPUs, as in the Llama 3 report
    model = FailureModel(cluster, 16_384 * 54 * 24 / 419, random.Random(0))
    assert model.rate * 54 * 86_400 == pytest.approx(419)
    assert model.node_mtbf_hours(8) == pytest.approx(16_384 * 54 * 24 / 419 / 8)
    times = []
    now = 0.0
    for _ in range(2000):
        drawn = model.next_failure(now)
        assert drawn is not None
        now = drawn[0]
        times.append(now)
    assert 2000 / now * 54 * 86_400 == pytest.approx(419, rel=0.1)
