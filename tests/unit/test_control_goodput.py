"""Goodput and ETTR from attempts' telemetry, worked out by hand."""

import pytest

from aicluster.control.views.goodput import goodput
from aicluster.train.telemetry import StepRecord


def attempt(start: float, steps: list[float], checkpoints: list[float] = ()) -> list[StepRecord]:
    records = [StepRecord("start", 0, start)]
    records += [StepRecord("step", 0, t, step=i + 1) for i, t in enumerate(steps)]
    records += [StepRecord("checkpoint", 0, t, step=1) for t in checkpoints]
    return records


def test_one_clean_attempt() -> None:
    result = goodput({1: attempt(0, [10, 20, 30, 100])})
    assert result.productive_seconds == 90 and result.lost_seconds == 0
    assert result.wall_seconds == 100
    assert result.ettr == pytest.approx(0.9)


def test_a_failure_loses_the_work_since_the_last_checkpoint() -> None:
    # Attempt 1 steps from 10 to 80, checkpoints at 50, dies; attempt 2 first steps at 95.
    result = goodput(
        {
            1: attempt(0, [10, 30, 50, 80], checkpoints=[50]),
            2: attempt(85, [95, 150]),
        }
    )
    assert result.productive_seconds == (50 - 10) + (150 - 95)
    assert result.lost_seconds == 80 - 50
    assert result.restart_seconds == 95 - 80
    assert result.checkpoints == 1
    assert result.ettr == pytest.approx(95 / 150)


def test_no_checkpoint_loses_the_whole_attempt() -> None:
    result = goodput({1: attempt(0, [10, 60]), 2: attempt(70, [80, 100])})
    assert result.lost_seconds == 50 and result.productive_seconds == 20


def test_no_telemetry_is_zero() -> None:
    assert goodput({}).ettr == 0.0
