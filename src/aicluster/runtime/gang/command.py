"""The command line of one rank's process, as :class:`~aicluster.runtime.gang.worker.RankWorker`
starts it cold: the job's script or module through the step timing shim (``_steptime.py``), in
bubblewrap when sandboxed, under the child shim (``sandbox/_child.py``: cgroups, limits, signals).
A warm start forks the same ``python_argv`` from the node's warm process instead."""

from __future__ import annotations

import sys
from pathlib import Path

from aicluster.core.numbers import ascii_int
from aicluster.runtime.sandbox.bwrap import CHILD_SHIM, SandboxSpec, bwrap_argv

__all__ = ["RankCommand", "signal_code", "visible_gpus"]

#: Runs the job's script with its steps and collective waits timed (see _steptime.py).
_STEP_SHIM = str(Path(__file__).with_name("_steptime.py"))


class RankCommand:
    """What :meth:`RankWorker.start` runs: the job's command, where, with what, in which sandbox."""

    def __init__(
        self,
        *,
        entrypoint: str | None,
        module: str | None,
        args: list[str],
        env: dict[str, str],
        workdir: str,
        stdout: Path,
        stderr: Path,
        sandbox: SandboxSpec | None,
        secret_names: frozenset[str] = frozenset(),
    ) -> None:
        self.entrypoint, self.module, self.args = entrypoint, module, args
        self.env, self.workdir, self.sandbox = env, workdir, sandbox
        self.secret_names = secret_names  # variables of env that hold the job's secrets
        self.stdout, self.stderr = stdout, stderr
        self.cgroup_procs: list[str] = []  # cgroups the process joins first
        self.rlimit_data: int | None = None  # where no cgroup could be made

    def python_argv(self) -> list[str]:
        """``python -u ENTRYPOINT ARGS`` or ``python -u -m MODULE ARGS``, through the step
        timing shim (which runs them as python would)."""
        target = ["-m", self.module] if self.module else [str(self.entrypoint)]
        return [sys.executable, "-u", _STEP_SHIM, *target, *self.args]

    def cold_argv(self) -> list[str]:
        """The command line of a cold start: through the shim, and bwrap when sandboxed."""
        if self.sandbox is None:
            return [sys.executable, CHILD_SHIM, *self.python_argv()]
        sandboxed = bwrap_argv(self.sandbox, self.python_argv())
        options = ["--ignore-term"]
        for procs in self.cgroup_procs:
            options += ["--cgroup", procs]
        if self.rlimit_data is not None:
            options += ["--rlimit-data", str(self.rlimit_data)]
        return [sys.executable, CHILD_SHIM, *options, "--", *sandboxed]


def visible_gpus(env: dict[str, str]) -> list[int]:
    """The GPU indices Ray gave this rank (``CUDA_VISIBLE_DEVICES``), for their device nodes."""
    numbers = (ascii_int(item) for item in env.get("CUDA_VISIBLE_DEVICES", "").split(","))
    return [number for number in numbers if number is not None]


def signal_code(code: int) -> int:
    """bwrap reports a job killed by signal N as 128 + N; Popen's convention is -N."""
    return -(code - 128) if 128 < code < 128 + 65 else code
