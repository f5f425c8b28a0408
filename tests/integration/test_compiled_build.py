"""The mypyc build of the simulator's hot path (``make compiled``, setup.py) builds from a clean
state, imports as compiled extensions, and passes the pure build's tests of what it compiles: the
golden replays' decision hashes, the scheduler's properties, and the unit tests of the scheduler,
the simulator and the domain types that do not patch the scheduler's internals (compiled calls
between functions of one module go around a patch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# The compiled build is optional: a machine without a C compiler or Python's headers runs the
# interpreted one (every machine this project's CI runs on has both).
CAN_COMPILE = (
    shutil.which("cc") is not None
    and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not CAN_COMPILE, reason="no C compiler or no Python.h to build with mypyc"),
]

ROOT = Path(__file__).resolve().parents[2]
# Tests that patch module functions or class attributes of compiled modules (they test the
# shortcuts against the interpreted build, which is the one they can reach: compiled code calls
# its functions directly, so a patch there would compare the build with itself), or subclass a
# compiled class.
PATCHES_INTERNALS = [
    "tests/unit/test_scheduler_fastpaths.py",
    # Defines a policy in the test module: an interpreted class cannot subclass a compiled one
    # (a policy of the compiled build lives in aicluster/scheduler/policies/, compiled with it).
    "tests/unit/test_scheduler_new_policy.py",
]


# The tests of what is compiled (the scheduler, the domain types, the simulator): the golden
# replays' decision hashes among them. The other unit tests (the API's views, the job output
# reader's fuzzing, ...) run interpreted code either way; the suite runs them once.
COMPILED_TESTS = [
    "tests/property/test_scheduler_properties.py",
    *sorted(
        str(path.relative_to(ROOT))
        for pattern in ("test_sim_*.py", "test_scheduler_*.py", "test_core.py", "test_jobspec.py")
        for path in (ROOT / "tests/unit").glob(pattern)
        if str(path.relative_to(ROOT)) not in PATCHES_INTERNALS
    ),
]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("compiled") / "build"
    # The C compiler at -O0 (setup.py's AICLUSTER_MYPYC_OPT): the same extensions, built 24 s
    # sooner here (54 s against 78 s, quiet) and their tests run 6 s longer.
    done = subprocess.run(
        ["make", "-s", "compiled", f"COMPILED={target}"],
        cwd=ROOT,
        env={**os.environ, "AICLUSTER_MYPYC_OPT": "0"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _run(compiled: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(compiled)}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_hot_path_imports_as_compiled_extensions(compiled: Path) -> None:
    modules = ["aicluster.scheduler.cycle", "aicluster.core.job", "aicluster.sim.engine"]
    code = (
        "import importlib, sys\nfor m in sys.argv[1:]: print(importlib.import_module(m).__file__)"
    )
    done = _run(compiled, "-c", code, *modules)
    assert done.returncode == 0, done.stderr
    files = done.stdout.split()
    assert len(files) == 3 and all(f.startswith(str(compiled)) for f in files), files
    assert all(f.endswith(".so") for f in files), files


def test_the_compiled_build_makes_the_same_decisions_and_passes_the_unit_tests(
    compiled: Path,
) -> None:
    ignored = [
        f"--deselect={path}" if "::" in path else f"--ignore={path}" for path in PATCHES_INTERNALS
    ]
    tests = [*COMPILED_TESTS, *ignored]
    done = _run(compiled, "-m", "pytest", "-q", "-rN", "-p", "no:cacheprovider", *tests)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-2000:]
