"""The stop contract with real signals: SIGTERM sets a flag a polling loop sees, the loop saves
and exits 0; a script that never polls dies of SIGTERM as before; a job's own handler stays.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aicluster import train

pytestmark = pytest.mark.integration

ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}


#: What a rank starts with: no signal blocked, SIGTERM's default action. A child inherits its
#: parent's signal mask and ignored signals across exec, and the pytest worker's are not a rank's
#: (one run's child never saw its SIGTERM: :func:`_signals` shows what it had).
CLEAN_SIGNALS = (
    "import signal\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK, [])\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
)


def _start(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CLEAN_SIGNALS + code], env=ENV, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _signals(pid: int) -> str:
    """The process's blocked, ignored and caught signals and its threads (``/proc``), for a
    failure message."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as error:
        return f"(status unreadable: {error})"
    wanted = ("SigBlk", "SigIgn", "SigCgt", "Threads", "State")
    return ", ".join(line.replace("\t", " ") for line in lines if line.startswith(wanted))


def test_a_polling_loop_checkpoints_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    code = f"""
import time, torch, aicluster.train as t
t.init()
model = torch.nn.Linear(2, 2)
ckpt = t.Checkpointer({str(tmp_path)!r})
# A SIGTERM before the first poll kills the process by design (nobody would see the flag), so
# the loop says it is ready only after its first step: the signal then always finds a step done.
step = 0
while not t.should_stop():
    step += 1
    if step == 1:
        print("ready", flush=True)
    time.sleep(0.01)
ckpt.save(step, model=model, extra={{"why": "stop"}})
ckpt.close()
t.shutdown()
"""
    proc = _start(code)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    resumed = train.Checkpointer(tmp_path).load()
    assert resumed is not None and resumed.step > 0 and resumed.extra == {"why": "stop"}


def test_a_script_that_never_polls_still_dies_of_sigterm() -> None:
    proc = _start("import time, aicluster.train as t; t.init(); print('ready'); time.sleep(120)")
    try:
        before = _signals(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        assert code == -signal.SIGTERM, f"exit {code}; before: {before}; now: {_signals(proc.pid)}"
    finally:
        proc.kill()
        proc.wait()


def test_a_handler_the_job_installed_is_left_alone() -> None:
    code = (
        "import signal, time, aicluster.train as t\n"
        "signal.signal(signal.SIGTERM, lambda *_: print('mine', flush=True))\n"
        "t.init(); print('ready', flush=True); time.sleep(0.5)\n"
        "print(t.stop_requested(), flush=True)\n"
    )
    proc = _start(code)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.split() == ["mine", "False"]
