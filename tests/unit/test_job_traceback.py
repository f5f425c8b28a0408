"""A job's own exception reads as ``python SCRIPT`` prints it: the step shim that starts every
rank (``_steptime.py``) and runpy leave no frame in the traceback, and the exit code is 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SHIM = Path(__file__).resolve().parents[2] / "src/aicluster/runtime/gang/_steptime.py"


def _run(tmp_path: Path, code: str, *extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(SHIM), *extra, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_a_jobs_traceback_starts_at_its_own_code(tmp_path: Path) -> None:
    ran = _run(tmp_path, "def load():\n    open('poem.txt')\n\nload()\n")
    assert ran.returncode == 1
    lines = ran.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].endswith('job.py", line 4, in <module>'), ran.stderr
    assert "_steptime" not in ran.stderr and "runpy" not in ran.stderr
    assert lines[-1] == "FileNotFoundError: [Errno 2] No such file or directory: 'poem.txt'"


def test_a_jobs_own_excepthook_and_exit_code_are_kept(tmp_path: Path) -> None:
    hooked = "import sys\nsys.excepthook = lambda *a: print('own hook', file=sys.stderr)\n1 / 0\n"
    assert _run(tmp_path, hooked).stderr.strip() == "own hook"
    assert _run(tmp_path, "raise SystemExit(3)\n").returncode == 3
