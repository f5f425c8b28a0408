"""The restart rule (aicluster.scheduler.restarts) and how the loop classifies a gang's end."""

from aicluster.control.loop.attempts import failed_attempt
from aicluster.runtime import GangPhase, GangStatus, RankState, RankStatus
from aicluster.scheduler.restarts import FailedAttempt, backoff_s, refusal

OWN = FailedAttempt(False, 1, "ValueError: bad batch")


def test_the_jobs_own_error_restarts_once_and_its_repeat_ends_it() -> None:
    assert refusal(OWN, None, 0, 3) is None
    said = refusal(OWN, FailedAttempt(False, 1, "ValueError: bad batch"), 1, 3) or ""
    assert said.startswith("the same failure twice in a row, after 1 restart")
    assert refusal(OWN, FailedAttempt(False, 1, "OSError: fetch failed"), 1, 3) is None
    assert refusal(OWN, FailedAttempt(False, 2, "ValueError: bad batch"), 1, 3) is None


def test_the_infrastructures_failures_restart_until_max_restarts() -> None:
    lost = FailedAttempt(True)
    assert refusal(lost, lost, 1, 3) is None
    assert refusal(lost, OWN, 2, 3) is None and refusal(OWN, lost, 2, 3) is None
    assert refusal(lost, lost, 3, 3) == "after 3 restarts"


def test_restart_on_any_restarts_the_same_error_until_max_restarts() -> None:
    assert refusal(OWN, OWN, 1, 3, "any") is None
    assert refusal(OWN, OWN, 3, 3, "any") == "after 3 restarts"


def test_a_crash_loop_backs_off_doubling_to_the_cap_and_a_trained_attempt_at_once() -> None:
    assert [backoff_s(streak, 5.0, 60.0) for streak in range(6)] == [0, 5, 10, 20, 40, 60]


def _status(*ranks: RankStatus) -> GangStatus:
    return GangStatus("j", 1, GangPhase.FAILED, ranks)


def test_a_lost_rank_or_a_rank_never_started_is_the_infrastructures() -> None:
    lost = RankStatus(0, "n0", RankState.LOST, finished_at=2.0)
    peer = RankStatus(1, "n1", RankState.EXITED, 1, finished_at=1.0, stderr_tail="NCCL error")
    assert failed_attempt(_status(lost, peer)) == FailedAttempt(True, 1)
    unstarted = RankStatus(0, "n0", RankState.EXITED, None, finished_at=1.0)
    assert failed_attempt(_status(unstarted)).infrastructure
    assert failed_attempt(None) == FailedAttempt(True)


def test_a_rank_of_the_jobs_code_that_exits_non_zero_is_the_jobs_own() -> None:
    tail = "Traceback (most recent call last):\n  ...\nValueError: bad \x1b[31mbatch\n"
    first = RankStatus(1, "n1", RankState.EXITED, 1, finished_at=1.0, stderr_tail=tail)
    later = RankStatus(0, "n0", RankState.EXITED, -6, finished_at=2.0, stderr_tail="abort")
    assert failed_attempt(_status(later, first)) == FailedAttempt(
        False, 1, "ValueError: bad [31mbatch"
    )


def test_a_rank_sigkilled_from_outside_is_the_infrastructures_but_over_its_limit_its_own() -> None:
    """A SIGKILL the launcher did not send (the node's OOM killer, an operator, a chaos test)
    says nothing about the job's code: two in a row must not end it."""
    for code in (-9, 137):
        killed = RankStatus(0, "n0", RankState.EXITED, code, finished_at=1.0)
        assert failed_attempt(_status(killed)) == FailedAttempt(True, code)
    over = RankStatus(0, "n0", RankState.EXITED, -9, finished_at=1.0, reason="exceeded memory_gb=4")
    assert not failed_attempt(_status(over)).infrastructure
    segfault = RankStatus(0, "n0", RankState.EXITED, -11, finished_at=1.0)
    assert not failed_attempt(_status(segfault)).infrastructure
