"""Optional compiled build of the simulator's hot path (everything else is in pyproject.toml).

``AICLUSTER_MYPYC=1 pip install --no-build-isolation .`` compiles the scheduler, the domain model
it reads and the simulator's event loop to C extensions with mypyc (the compiler mypy and black
ship with): the same source, the same decisions, a third to a half less CPU time in a replay
(docs/benchmarks.md). Without the variable the package is pure Python, which is what the tests
patch and what an editable install runs. ``make compiled`` builds it into ``.build/compiled``.
"""

from __future__ import annotations

import os

from setuptools import setup

# Typed, pure modules only: mypyc checks them like mypy --strict and compiles them. The rest of the
# package (API, runtime, CLI) stays interpreted: it waits on I/O, not on the interpreter.
COMPILED = [
    "src/aicluster/core/job.py",
    "src/aicluster/core/plan.py",
    "src/aicluster/core/resources.py",
    "src/aicluster/core/tenants.py",
    "src/aicluster/core/topology.py",
    "src/aicluster/scheduler/",
    "src/aicluster/sim/comm.py",
    "src/aicluster/sim/config.py",
    "src/aicluster/sim/engine.py",
    "src/aicluster/sim/events.py",
    "src/aicluster/sim/failures.py",
    "src/aicluster/sim/job_events.py",
    "src/aicluster/sim/metrics.py",
    "src/aicluster/sim/node_events.py",
    "src/aicluster/sim/shares.py",
    "src/aicluster/sim/synthetic.py",
    "src/aicluster/sim/trace_job.py",
]


def _extensions() -> list[object]:
    if os.environ.get("AICLUSTER_MYPYC", "") in ("", "0"):
        return []
    from mypyc.build import mypycify  # only the compiled build needs mypy installed

    # AICLUSTER_MYPYC_OPT: the C compiler's level (tests build at 0: same code, built sooner).
    return mypycify(COMPILED, opt_level=os.environ.get("AICLUSTER_MYPYC_OPT", "3"))


setup(ext_modules=_extensions())
