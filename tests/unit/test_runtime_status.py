"""Gang phases from rank states, and the run directory's readers."""

from pathlib import Path

from aicluster.runtime.gang.status import GangPhase, GangStatus, RankState, RankStatus, gang_phase
from aicluster.runtime.rundir import RunDir


def rank(
    r: int,
    state: RankState,
    code: int | None = None,
    stopped: bool = False,
    at: float | None = None,
) -> RankStatus:
    return RankStatus(r, "n", state, exit_code=code, stopped=stopped, finished_at=at)


def test_phases() -> None:
    running, pending = rank(0, RankState.RUNNING), rank(1, RankState.PENDING)
    ok = rank(1, RankState.EXITED, 0)
    assert gang_phase([running, pending], False) is GangPhase.PENDING
    assert gang_phase([running, ok], False) is GangPhase.RUNNING
    assert gang_phase([ok, rank(0, RankState.EXITED, 0)], False) is GangPhase.SUCCEEDED
    assert gang_phase([ok, rank(0, RankState.EXITED, 3)], False) is GangPhase.FAILED
    assert gang_phase([running, rank(0, RankState.LOST)], False) is GangPhase.FAILED
    stopped = rank(0, RankState.EXITED, -15, stopped=True)
    assert gang_phase([stopped, ok], True) is GangPhase.STOPPED
    assert gang_phase([stopped, running], True) is GangPhase.RUNNING  # still stopping
    # a failure before the stop stays a failure
    assert gang_phase([stopped, rank(1, RankState.EXITED, 1)], True) is GangPhase.FAILED
    assert GangPhase.STOPPED.terminal and not GangPhase.PENDING.terminal


def test_first_failure_comes_first_and_signals_are_named() -> None:
    later = rank(0, RankState.EXITED, 1, at=20.0)
    first = rank(2, RankState.EXITED, -9, at=10.0)
    status = GangStatus("j", 0, GangPhase.FAILED, (later, rank(1, RankState.RUNNING), first))
    assert [r.rank for r in status.failed_ranks] == [2, 0]
    assert "killed by SIGKILL" in first.describe()
    assert "exited with code 1" in later.describe()
    assert status.exit_codes == {0: 1, 1: None, 2: -9}


def test_run_dir_reads_logs_from_an_offset_and_tails(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "job", 1)
    assert run.read_log(0).text == "" and run.tail(0) == ""
    run.path.mkdir(parents=True)
    run.log_file(0).write_text("hello\nworld\n")
    first = run.read_log(0, max_bytes=6)
    assert first.text == "hello\n"
    assert run.read_log(0, offset=first.offset).text == "world\n"
    run.log_file(0, "stderr").write_text("x" * 5000 + "Boom\n")
    assert run.tail(0, "stderr").endswith("Boom\n")
    (run.job_dir / "0").mkdir()
    assert RunDir.attempts(tmp_path, "job") == [0, 1]
