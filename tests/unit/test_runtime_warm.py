"""The warm process forks rank processes that behave like ``python -u script``: exit codes,
tracebacks, signals, logs, environment, argv and working directory, and death with their asker.

A real warm process (``_zygote.py``, torch preloaded), no Ray."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.runtime.warm import starter as warm
from aicluster.runtime.warm.starter import spawn_warm, warm_compatible
from warmprocs import OWN, start_zygote


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    channel, process = start_zygote(tmp_path_factory.mktemp("zygote"), "torch")
    yield channel
    process.kill()
    process.wait()


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


def _spawn(zygote: Path, tmp_path: Path, script: Path, *args: str, **env: str) -> warm.WarmChild:
    child = spawn_warm(
        zygote,
        OWN,
        [str(script), *args],
        {**os.environ, **env},
        str(tmp_path),
        tmp_path / "out.log",
        tmp_path / "err.log",
    )
    assert child is not None
    return child


def test_a_warm_child_runs_the_script_as_main_with_its_argv_env_and_cwd(
    zygote: Path, tmp_path: Path
) -> None:
    script = _script(
        tmp_path,
        """
        import os, sys, torch
        print(__name__, sys.argv[1:], os.environ["JOB_VALUE"], os.getcwd(), flush=True)
        print("threads", torch.get_num_threads())
        print("session leader", os.getsid(0) == os.getpid())
        env = os.environ
        print("warm", env["AICLUSTER_WARM_STARTED"], float(env["AICLUSTER_SPAWNED_AT"]) > 0)
        print("to stderr", file=sys.stderr)
        sys.exit(3)
        """,
    )
    child = _spawn(zygote, tmp_path, script, "a", "b", JOB_VALUE="x", OMP_NUM_THREADS="1")
    assert child.wait() == 3
    out = (tmp_path / "out.log").read_text().splitlines()
    assert out[0] == f"__main__ ['a', 'b'] x {tmp_path}"
    assert out[1:] == ["threads 1", "session leader True", "warm 1 True"]
    assert (tmp_path / "err.log").read_text() == "to stderr\n"


def test_an_exception_exits_1_with_its_traceback_on_stderr(zygote: Path, tmp_path: Path) -> None:
    script = _script(tmp_path, "raise ValueError('boom')\n")
    assert _spawn(zygote, tmp_path, script).wait() == 1
    assert "ValueError: boom" in (tmp_path / "err.log").read_text()


def test_a_killed_child_reports_the_signal(zygote: Path, tmp_path: Path) -> None:
    script = _script(tmp_path, "import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    child = _spawn(zygote, tmp_path, script)
    _wait_for(
        lambda: (tmp_path / "out.log").exists() and "up" in (tmp_path / "out.log").read_text()
    )
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL


def test_a_child_dies_when_its_asker_goes_away(zygote: Path, tmp_path: Path) -> None:
    script = _script(tmp_path, "import time\ntime.sleep(60)\n")
    child = _spawn(zygote, tmp_path, script)
    pid = child.pid
    assert _alive(pid)
    child._conn.close()  # what the death of the asking actor does to its connection
    child._reader.close()
    _wait_for(lambda: not _alive(pid))


def test_children_die_with_the_warm_process(tmp_path: Path) -> None:
    name, process = start_zygote(tmp_path, "")
    child = _spawn(name, tmp_path, _script(tmp_path, "import time\ntime.sleep(60)\n"))
    assert _alive(child.pid)
    process.kill()
    process.wait()
    _wait_for(lambda: not _alive(child.pid))
    assert child.wait() == -signal.SIGKILL  # as far as the asker can tell


def test_no_warm_process_means_a_cold_start(tmp_path: Path) -> None:
    (tmp_path / "channels").mkdir(mode=0o700)
    none = tmp_path / "channels" / "none"
    assert spawn_warm(none, OWN, ["x.py"], {}, ".", tmp_path / "o", tmp_path / "e") is None


def test_environments_that_change_interpreter_start_up_are_started_cold() -> None:
    base = {"PATH": "/bin", "PYTHONPATH": "/src"}
    assert warm_compatible({"PATH": "/bin", "PYTHONPATH": "/src", "JOB": "1"}, base)
    assert warm_compatible({"OMP_NUM_THREADS": "4"}, base)
    assert not warm_compatible({"PYTHONPATH": "/other"}, base)
    assert not warm_compatible({"LD_PRELOAD": "x.so"}, base)
    assert not warm_compatible({"AICLUSTER_WARM_START": "0"}, base)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(condition, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
