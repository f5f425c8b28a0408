"""``aicluster rollout``'s argument parsers."""

from __future__ import annotations

import pytest
import typer

from aicluster.cli.rollouts import parse_duration, parse_rate, parse_steps


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("2m", 120), ("1h", 3600), ("45", 45), ("1.5s", 1.5), ("500ms", 0.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "rate"), [("1%", 0.01), ("0.01", 0.01), ("0", 0), ("100%", 1)])
def test_rates(text: str, rate: float) -> None:
    assert parse_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize(
    ("parser", "text", "message"),
    [
        (parse_duration, "soon", "not a duration"),
        (parse_duration, "-3s", "not a duration"),
        (parse_rate, "5", "fraction in [0, 1]"),
        (parse_rate, "lots", "not a rate"),
        (parse_steps, "10,half,100", "whole percentages"),
    ],
)
def test_bad_values_are_readable(parser: object, text: str, message: str) -> None:
    with pytest.raises(typer.BadParameter, match=message.replace("[", r"\[").replace("]", r"\]")):
        parser(text)  # type: ignore[operator]


def test_steps() -> None:
    assert parse_steps("10,25,50,100") == [10, 25, 50, 100]
    assert parse_steps("100") == [100]
