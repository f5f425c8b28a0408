"""``aicluster why``, ``jobs`` and ``logs`` as a person reads them, at 80 columns: a failed job
explains itself (rank, node, exit code or signal, its stderr's last lines), no line of ``why``
goes back to column 0 and no path is broken, ``logs`` prints stdout and stderr in whole lines,
and ``logs -f`` on a pending job says it waits, then follows it once it starts.

The commands run in Typer's CliRunner against a stub of the API client (the answers are the
API's, as in ``tests/integration/test_failure_api.py``, which runs them against a server)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner, Result

from aicluster.cli import common, joblogs
from aicluster.cli.main import app

JOB = "j-0192a3b4c5d6e7f8a9b"
PATH = "/home/alice/projects/a-rather-long-project-name/src/training/loop/train_step.py"
TAIL = [
    "Traceback (most recent call last):",
    f'  File "{PATH}", line 20, in <module>',
    "    main()",
    "ValueError: loss is nan at step 20 (lr=0.1, batch=512); lower the learning rate",
]
FAILURE = {
    "rank": 1,
    "node": "node-rack0-07",
    "summary": "rank 1 on node-rack0-07 exited with code 1",
    "exit_code": 1,
    "signal": None,
    "lost": False,
    "attempt": 2,
    "stderr_tail": TAIL,
}
SCORE = [
    {"term": "level", "value": 2, "meaning": "the domain's level: node 0, rack 1, pod 2, cluster 3"
     " (lower is tighter: more bandwidth between the job's ranks)"},
    {"term": "free_left_on_nodes", "value": 8, "meaning": "GPUs left free on the nodes it uses"
     " (lower is a tighter best fit, keeping whole nodes free for big jobs)"},
]  # fmt: skip


def why_answer(state: str, **fields: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "job_id": JOB, "state": state, "position": None, "code": None, "reason": "",
        "estimated_start": None, "placement": None, "score": [], "straggler": None,
        "data": None, "failure": None,
    }  # fmt: skip
    return {**answer, **fields}


class Stub:
    """The API client: ``answers`` by path (a callable gets the query)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers, self.calls = answers, []  # type: list[tuple[str, dict[str, Any]]]

    def get(self, path: str, **params: Any) -> Any:
        self.calls.append((path, params))
        answer = self.answers[path]
        return answer(**params) if callable(answer) else answer


def run(monkeypatch: pytest.MonkeyPatch, stub: Stub, *args: str) -> Result:
    monkeypatch.setattr(common, "client_for", lambda *_: stub)
    monkeypatch.setattr(joblogs.time, "sleep", lambda _: None)
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})


def lines_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def assert_fits(text: str) -> None:
    """Every line within 80 columns but a single word too long for any line; every line after
    the first indented (nothing wraps back to column 0)."""
    lines = lines_of(text)
    for line in lines:
        assert len(line) <= 80 or " " not in line.strip(), line
    assert all(line.startswith("  ") for line in lines[1:]), text


def test_why_on_a_failed_job_gives_rank_node_exit_and_the_traceback_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reason = (
        f"rank 1 on node-rack0-07 exited with code 1: {TAIL[-1]} (after 1 restart) "
        f"while reading {PATH}"
    )
    answer = why_answer(
        "FAILED", reason=reason, failure=FAILURE, score=SCORE,
        placement={"level": "rack", "domain": "rack0", "slots": [["node-rack0-07", 8, 0]]},
    )  # fmt: skip
    shown = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/why": answer}), "why", JOB)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert_fits(text)
    assert "failed: rank 1 on node-rack0-07 (attempt 2), exit code 1" in text
    assert "its stderr's last 4 lines:" in text
    assert "\n      File\n" in text and "\n        main()\n" in text  # its indentation kept
    assert f'\n      "{PATH}",\n' in text  # the path whole, on a line of its own
    assert any(line.strip() == PATH for line in text.splitlines())  # the reason's too
    assert "ValueError: loss is nan at step 20" in text
    assert f"aicluster logs {JOB} --rank 1 --stream stderr" in " ".join(text.split())
    assert "placement score" not in text and "placed in" not in text  # not why it failed


def test_why_on_a_killed_or_lost_rank_names_the_signal_or_the_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    killed = {**FAILURE, "exit_code": -9, "signal": "SIGKILL", "stderr_tail": []}
    lost = {**FAILURE, "exit_code": None, "lost": True, "stderr_tail": []}
    for failure, said in ((killed, "killed by SIGKILL (exit code -9)"), (lost, "no exit")):
        answer = why_answer("FAILED", reason="failed", failure=failure)
        shown = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/why": answer}), "why", JOB)
        assert said in shown.stdout and "its stderr is empty" in shown.stdout, shown.output
    hung = why_answer(  # no failed rank: its message, and still not its placement
        "FAILED", reason="hung: no step from every rank 120s after the start", score=SCORE,
        placement={"level": "node", "domain": "n1", "slots": [["n1", 8, 0]]},
    )  # fmt: skip
    shown = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/why": hung}), "why", JOB)
    assert shown.stdout == f"{JOB} is FAILED\n  {hung['reason']}\n"


def test_why_on_pending_and_running_jobs_wraps_under_its_indentation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiting = why_answer(
        "PENDING", position=3, code="QUOTA",
        reason="waits for 32 H100 on one rack: tenant vision is at its quota of 64 and may "
        "borrow none; 3 jobs of higher priority are ahead of it in the queue",
    )  # fmt: skip
    shown = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/why": waiting}), "why", JOB)
    assert shown.exit_code == 0, shown.output
    assert_fits(shown.stdout)
    assert "PENDING, position 3 in the queue" in shown.stdout
    assert "estimated start: unknown" in shown.stdout
    running = why_answer(
        "RUNNING", reason="placed on the rack with the fewest GPUs left free", score=SCORE,
        placement={"level": "rack", "domain": "rack0", "slots": [["n1", 8, 0], ["n2", 8, 0]]},
    )  # fmt: skip
    shown = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/why": running}), "why", JOB)
    text = shown.stdout
    assert_fits(text)
    assert "placed in rack rack0: n1, n2" in text
    lines = text.splitlines()
    score_lines = lines[lines.index("  placement score (how this placement ranked):") + 1 :]
    starts = [line for line in score_lines if " = " in line]
    assert [line.split("=")[0].strip() for line in starts] == ["level", "free_left_on_nodes"]
    meaning = 4 + 18 + 3 + 7  # where a meaning starts; its next lines start there too
    assert all(line.startswith(" " * meaning) for line in score_lines if " = " not in line)
    assert len(score_lines) > len(starts)  # the meanings did wrap


def test_jobs_shows_a_failure_in_a_short_column(monkeypatch: pytest.MonkeyPatch) -> None:
    job = {
        "id": JOB, "name": "llama-finetune", "tenant": "vision", "state": "FAILED",
        "spec": {"workers": 2, "resources": {"gpus": 8}}, "submitted_at": 0.0,
        "pending": None, "exit_message": "rank 1 on node-rack0-07 exited with code 1: ...",
        "failure": FAILURE, "placement": None, "priority": 200, "submitted_by": "alice",
        "restarts": 1, "finished_at": 1.0,
    }  # fmt: skip
    shown = run(monkeypatch, Stub({"/v1/jobs": {"jobs": [job], "next_cursor": None}}), "jobs")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), shown.stdout
    assert JOB in lines[1] and "FAILED" in lines[1]
    cells = [lines[1][lines[1].index("exit 1") :], *lines[2:]]
    note = " ".join(cell.strip() for cell in cells)
    assert note.startswith("exit 1: ValueError: loss is nan at step") and note.endswith("…")
    assert len(lines) <= 5  # a short column: a few lines, not the traceback


def logs_route(views: list[dict[str, Any]]) -> Any:
    """The logs route over a job whose files grow as ``views`` say, one view a poll: {state,
    attempt, stdout, stderr} (each file's whole text so far). The next view comes once a read
    of the latest attempt's stderr finds nothing more (the reader's poll is over). Files are
    read 10 characters a call, so a stream takes several reads."""
    at = 0

    def answer(rank: int, stream: str, offset: int, attempt: int | None = None) -> dict[str, Any]:
        nonlocal at
        view = views[at] if attempt is None else [v for v in views if v["attempt"] == attempt][-1]
        text = view.get(stream, "")[offset : offset + 10]
        if attempt is None and stream == "stderr" and not text:
            at = min(at + 1, len(views) - 1)
        return {
            "text": text, "next_offset": offset + len(text), "attempt": view["attempt"],
            "state": view["state"],
        }  # fmt: skip

    return answer


def test_logs_prints_stdout_and_stderr_in_whole_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    done = {
        "state": "FAILED", "attempt": 1, "stdout": "step 1\nstep 2\nno newline at the end",
        "stderr": "Traceback (most recent call last):\nValueError: nan\n",
    }  # fmt: skip
    stub = Stub({f"/v1/jobs/{JOB}/logs": logs_route([done])})
    shown = run(monkeypatch, stub, "logs", JOB)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == (
        "step 1\nstep 2\nno newline at the end\nTraceback (most recent call last):\n"
        "ValueError: nan\n"
    )
    only = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/logs": logs_route([done])}), "logs", JOB,
               "--stream", "stderr")  # fmt: skip
    assert only.stdout == done["stderr"]
    bad = run(monkeypatch, stub, "logs", JOB, "--stream", "both")
    assert bad.exit_code == 2 and "stdout" in bad.output


def test_logs_follow_waits_for_a_pending_job_then_follows_its_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = [
        {"state": "PENDING", "attempt": None},
        {"state": "PENDING", "attempt": None},
        {"state": "RUNNING", "attempt": 1, "stdout": "a1\n", "stderr": "w"},
        {"state": "RUNNING", "attempt": 1, "stdout": "a1\nb1\n", "stderr": "warn 1\n"},
        {"state": "RUNNING", "attempt": 2, "stdout": "a2\n"},
        {"state": "SUCCEEDED", "attempt": 2, "stdout": "a2\nb2\n", "stderr": "bye\n"},
    ]
    shown = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/logs": logs_route(script)}),
                "logs", JOB, "-f")  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == "a1\nb1\nwarn 1\na2\nb2\nbye\n"
    said = " ".join(shown.stderr.split())
    assert said.startswith(f"{JOB} is PENDING: waiting for it to start, then following")
    assert said.count("waiting") == 1 and "-- attempt 2 --" in said
    once = run(monkeypatch, Stub({f"/v1/jobs/{JOB}/logs": logs_route(script[:1])}), "logs", JOB)
    assert once.stdout == "" and "has not started: no output yet" in " ".join(once.stderr.split())
