"""The pipeline trigger evaluator (pure): cases, then properties over random histories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from aicluster.core.pipelines import Memory, Observation, PipelineSpec, Triggers, evaluate

DRIFT = Triggers.model_validate({"drift": {"threshold": 0.2, "sustained_s": 10}})
DATA = Triggers.model_validate({"new_data": ["rows"]})
ALL = Triggers.model_validate(
    {"drift": {"threshold": 0.2, "sustained_s": 10}, "new_data": ["rows"], "schedule_s": 100}
)


def look(now: float, score: float | None = None, rows: int = 1, **kw: Any) -> Observation:
    return Observation(now=now, drift_score=score, newest={"rows": rows}, **kw)


def run(triggers: Triggers, looks: list[Observation], memory: Memory | None = None) -> list[Any]:
    """Every look's decision, carrying the memory as the driver does."""
    memory = memory or Memory(seen={"rows": 1})
    decisions = []
    for seen in looks:
        decision = evaluate(triggers, 30.0, memory, seen)
        memory = decision.memory
        decisions.append(decision)
    return decisions


def test_drift_fires_only_once_sustained() -> None:
    fired = [d.fire for d in run(DRIFT, [look(t, 0.5) for t in range(0, 12)])]
    assert fired == [False] * 10 + [True, False]  # at 10 s, then the wait starts again


def test_a_look_under_the_threshold_or_without_a_score_restarts_the_wait() -> None:
    scores = [0.5] * 8 + [0.1] + [0.5] * 8 + [None] + [0.5] * 11
    fired = [d.fire for d in run(DRIFT, [look(t, s) for t, s in enumerate(scores)])]
    assert fired.index(True) == 18 + 10  # sustained from 18 s


def test_a_new_dataset_version_fires_and_waits_while_a_run_is_in_progress() -> None:
    decisions = run(DATA, [look(0, rows=2, busy=True), look(1, rows=2), look(2, rows=2)])
    assert [d.fire for d in decisions] == [False, True, False]
    assert decisions[1].reasons == ("new version rows:2",)
    assert decisions[1].memory.seen == {"rows": 2}


def test_triggers_that_hold_together_start_one_run_with_every_reason() -> None:
    memory = Memory(seen={"rows": 1}, last_fired=0, drift_since=0)
    decision = evaluate(ALL, 30.0, memory, look(100, 0.9, rows=3))
    assert decision.fire and len(decision.reasons) == 3
    assert decision.memory == Memory({"rows": 3}, 100, None, None)


def test_drift_and_schedule_wait_the_cooldown_after_a_run_but_new_data_does_not() -> None:
    memory = Memory(seen={"rows": 1}, last_fired=0, last_ended=95, drift_since=0)
    drifting = evaluate(ALL, 30.0, memory, look(100, 0.9, rows=1))
    assert not drifting.fire  # ended 5 s ago: no drift or schedule run yet
    assert evaluate(ALL, 30.0, memory, look(100, 0.9, rows=2)).reasons == ("new version rows:2",)
    assert evaluate(ALL, 30.0, memory, look(125, 0.9, rows=1)).fire


def test_memory_round_trips_through_json() -> None:
    memory = Memory({"rows": 4}, 12.5, 20.0, 15.0)
    assert Memory.from_json(memory.to_json()) == memory


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"triggers": {}}, "at least one trigger"),
        ({"deployment": "other"}, "not the deployment's"),
        ({"triggers": {"new_data": ["logs"]}}, "does not read logs"),
        ({"canary": {"steps": [50, 20, 100]}}, "increase strictly"),
        ({"job": {"name": "clf", "entrypoint": "t.py", "secrets": {"K": "v"}}}, "secrets"),
    ],
)
def test_a_bad_spec_names_its_problem(change: dict[str, Any], message: str) -> None:
    spec = {
        "name": "p",
        "deployment": "clf",
        "job": {"name": "clf", "entrypoint": "t.py", "data": ["rows:latest"]},
        "triggers": {"new_data": ["rows"]},
    }
    PipelineSpec.model_validate(spec)
    with pytest.raises(ValueError, match=message):
        PipelineSpec.model_validate({**spec, **change})


def test_the_example_pipeline_is_valid() -> None:
    path = Path(__file__).parents[2] / "examples" / "pipelines" / "retrain-on-drift.yaml"
    spec = PipelineSpec.model_validate(yaml.safe_load(path.read_text()))
    assert spec.deployment == spec.job.model_name == "tiny-gpt"


histories = st.lists(
    st.tuples(
        st.floats(0, 5),  # seconds since the previous look
        st.one_of(st.none(), st.floats(0, 1)),  # drift score
        st.integers(0, 2),  # versions pushed since the previous look
        st.booleans(),  # a run in progress
        st.booleans(),  # paused
    ),
    max_size=60,
)


def replay(history: list[tuple[float, float | None, int, bool, bool]]) -> list[Any]:
    now, rows, looks = 0.0, 1, []
    for step, score, pushed, busy, paused in history:
        now, rows = now + step, rows + pushed
        looks.append(look(now, score, rows, busy=busy, paused=paused))
    return list(zip(looks, run(ALL, looks), strict=True))


@settings(max_examples=300, deadline=None)
@given(histories)
def test_never_fires_while_busy_or_paused_and_never_twice_for_one_version(
    history: list[tuple[float, float | None, int, bool, bool]],
) -> None:
    fired_for: set[int] = set()
    for seen, decision in replay(history):
        if seen.busy or seen.paused:
            assert not decision.fire
        for reason in decision.reasons:
            if reason.startswith("new version"):
                version = int(reason.rsplit(":", 1)[1])
                assert version not in fired_for
                fired_for.add(version)


@settings(max_examples=300, deadline=None)
@given(histories)
def test_drift_fires_only_after_every_look_of_the_window_was_over_the_threshold(
    history: list[tuple[float, float | None, int, bool, bool]],
) -> None:
    looks = replay(history)
    for index, (seen, decision) in enumerate(looks):
        if not any(r.startswith("drift") for r in decision.reasons):
            continue
        streak = [s for s, _ in looks[: index + 1] if s.now >= seen.now - 10]
        assert all(s.drift_score is not None and s.drift_score >= 0.2 for s in streak)
        earlier = looks[: index + 1]
        # The streak began at or before the window's start: some look that old was over it too.
        first = next(
            i for i in range(index, -1, -1)
            if i == 0 or earlier[i - 1][0].drift_score is None
            or earlier[i - 1][0].drift_score < 0.2 or earlier[i - 1][1].fire
        )  # fmt: skip
        assert seen.now - earlier[first][0].now >= 10
