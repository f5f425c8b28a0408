"""One duration parser: the job spec's durations, the rollout flags and ``--since`` take the
same forms, and refusals list them."""

from __future__ import annotations

import pytest
import typer

from aicluster.cli.audit import parse_time
from aicluster.cli.rollouts import parse_duration as rollout_flag
from aicluster.core import JobSpecError, parse_jobspec
from aicluster.core.durations import DURATION_FORMS, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("20s", 20), ("90m", 5400), ("2h", 7200), ("1d", 86_400), ("1w", 604_800),
        ("500ms", 0.5), ("600", 600), ("1.5", 1.5), (" 2 h ", 7200), (".5h", 1800), (45, 45.0),
    ],
)  # fmt: skip
def test_the_accepted_forms(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "-3s", "2 hours", "1e3", "", "3s4", "x" * 1000])
def test_a_refusal_lists_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration") as caught:
        parse_duration(text)
    assert DURATION_FORMS in str(caught.value) and len(str(caught.value)) < 160


@pytest.mark.parametrize("value", [True, -1, float("inf"), float("nan")])
def test_numbers_that_are_no_duration(value: float) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(value)


def test_the_spec_takes_durations_with_units_and_stores_seconds() -> None:
    spec = parse_jobspec(
        "name: a\nentrypoint: t.py\nduration_estimate: 20s\ncheckpoint_interval: 90m\n"
    )
    assert (spec.duration_estimate, spec.checkpoint_interval) == (20.0, 5400.0)
    plain = parse_jobspec("name: a\nentrypoint: t.py\nduration_estimate: 20\n")
    assert plain.duration_estimate == 20.0  # plain numbers are still seconds
    hours = parse_jobspec("name: a\nentrypoint: t.py\nduration_estimate: 2h\n")
    seconds = parse_jobspec("name: a\nentrypoint: t.py\nduration_estimate: 7200\n")
    assert hours.spec_hash == seconds.spec_hash


def test_a_bad_duration_in_a_spec_names_its_line_and_the_forms() -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_jobspec("name: a\nentrypoint: t.py\nduration_estimate: soon\n", "job.yaml")
    assert str(caught.value) == (
        f"job.yaml:3: duration_estimate: 'soon' is not a duration: give {DURATION_FORMS}"
    )
    with pytest.raises(JobSpecError, match="greater than 0"):
        parse_jobspec("name: a\nentrypoint: t.py\ncheckpoint_interval: 0s\n")


def test_the_flags_share_the_parser() -> None:
    assert rollout_flag("1d") == 86_400
    with pytest.raises(typer.BadParameter, match="500ms, 20s, 90m, 2h"):
        rollout_flag("soon")
    assert parse_time("90", "--since", now=1000.0) == 910.0
    assert parse_time("1.5h", "--since", now=10_000.0) == 4600.0
