"""Hard limits on one rank's processes, with the host's cgroups (v2 where its controllers are
delegated to us, v1 otherwise, as on our machines).

Each rank gets a cgroup of its own below the node process's own cgroup (so the host's limits on
the node still hold) in the memory, cpu and pids controllers: the memory its spec asked for
(``memory_gb`` per worker; a rank is a worker), a CPU quota of its ``cpus`` and a process-count
limit. The launcher (root) makes it; the rank's first process joins it before the job's code runs
(``_child.py --cgroup``, or a warm child through a descriptor the launcher opened), so everything
the job starts stays inside. When the kernel kills a process of the rank for memory, the cgroup
counts it (``oom_kill``), and the rank's exit says "exceeded memory_gb=N".

Where no cgroup can be made (no controller, or not root), :func:`support` says so and ranks run
with a ``RLIMIT_DATA`` of their memory instead (``--rlimit-data``): it caps what a process
allocates, not what it and its children hold together.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_PIDS", "CgroupUnavailable", "Limits", "RankCgroup", "support"]

ROOT = Path("/sys/fs/cgroup")
_V1_CONTROLLERS = ("memory", "cpu", "pids")
_CPU_PERIOD_US = 100_000
#: Processes and threads one rank may hold together (torch starts a thread per core and more).
DEFAULT_PIDS = 4096


class CgroupUnavailable(OSError):
    """No cgroup can be made for a rank on this host."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one rank may hold: bytes of memory, CPUs (a quota, fractional allowed), processes."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = DEFAULT_PIDS

    @classmethod
    def for_worker(cls, memory_gb: float, cpus: float) -> Limits:
        return cls(
            memory_bytes=int(memory_gb * (1 << 30)) if memory_gb > 0 else None,
            cpus=cpus if cpus > 0 else None,
        )


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller, and ``""`` (the v2 key) for the unified one."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    return found


def _version() -> int:
    """2 where the unified hierarchy at /sys/fs/cgroup has the memory controller, else 1 where
    the v1 controllers are mounted, else 0."""
    controllers = ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return 2
    if all((ROOT / name / "cgroup.procs").exists() for name in _V1_CONTROLLERS):
        return 1
    return 0


def support() -> str:
    """``"cgroup v1"``, ``"cgroup v2"`` or why ranks fall back to rlimits, in words."""
    if os.geteuid() != 0:
        return "rlimits (not root: no cgroup can be made)"
    version = _version()
    if version == 0:
        return "rlimits (no memory, cpu and pids cgroup controllers on this host)"
    try:
        probe = RankCgroup.make(f"probe-{os.getpid()}", Limits(memory_bytes=1 << 30))
    except OSError as error:
        return f"rlimits (cannot make a cgroup: {error})"
    probe.remove()
    return f"cgroup v{version}"


class RankCgroup:
    """One rank's cgroup: one directory per v1 controller, or one v2 directory."""

    def __init__(self, folders: list[Path], version: int) -> None:
        self.folders, self.version = folders, version

    @classmethod
    def make(cls, name: str, limits: Limits) -> RankCgroup:
        """Make (or reuse) the cgroup ``name`` with ``limits``. Raises :class:`CgroupUnavailable`
        (an ``OSError``)."""
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise ValueError(f"not a cgroup name: {name!r}")
        version, own = _version(), _own_paths()
        if version == 0:
            raise CgroupUnavailable("no cgroup controllers")
        if version == 2:
            folder = ROOT / own.get("", "/").lstrip("/") / "aicluster" / name
            _enable_v2(folder.parent)
            folders = [folder]
        else:
            folders = [
                ROOT / c / own.get(c, "/").lstrip("/") / "aicluster" / name for c in _V1_CONTROLLERS
            ]
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        made = cls(folders, version)
        made._apply(limits)
        return made

    def _apply(self, limits: Limits) -> None:
        writes: list[tuple[str, str]] = []
        if self.version == 2:
            if limits.memory_bytes is not None:
                writes += [("memory.max", str(limits.memory_bytes)), ("memory.swap.max", "0")]
            if limits.cpus is not None:
                writes.append(("cpu.max", f"{int(limits.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}"))
            if limits.pids is not None:
                writes.append(("pids.max", str(limits.pids)))
        else:
            if limits.memory_bytes is not None:
                writes.append(("memory.limit_in_bytes", str(limits.memory_bytes)))
            if limits.cpus is not None:
                writes += [
                    ("cpu.cfs_period_us", str(_CPU_PERIOD_US)),
                    ("cpu.cfs_quota_us", str(int(limits.cpus * _CPU_PERIOD_US))),
                ]
            if limits.pids is not None:
                writes.append(("pids.max", str(limits.pids)))
        for file, value in writes:
            self._write(file, value)

    def _write(self, file: str, value: str) -> None:
        for folder in self.folders:
            target = folder / file
            if target.exists():
                target.write_text(value)
                return
        if file != "memory.swap.max":  # absent where swap accounting is off: nothing to cap
            raise CgroupUnavailable(f"no {file} in {self.folders}")

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes itself into to join (one per folder)."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for memory."""
        for folder in self.folders:
            for file, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                with contextlib.suppress(OSError):
                    for line in (folder / file).read_text().splitlines():
                        name, _, count = line.partition(" ")
                        if name == key and int(count) > 0:
                            return True
        return False

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left in it and remove it (idempotent)."""
        deadline = time.monotonic() + timeout_s
        for folder in self.folders:
            while folder.exists():
                with contextlib.suppress(OSError):
                    for pid in (folder / "cgroup.procs").read_text().split():
                        with contextlib.suppress(OSError):
                            os.kill(int(pid), signal.SIGKILL)
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)


def _enable_v2(parent: Path) -> None:
    """Delegate the memory, cpu and pids controllers to the cgroups below ``parent``."""
    parent.mkdir(parents=True, exist_ok=True)
    control = parent / "cgroup.subtree_control"
    wanted = " ".join(f"+{name}" for name in _V1_CONTROLLERS)
    try:
        control.write_text(wanted)
    except OSError as error:
        raise CgroupUnavailable(f"cannot delegate controllers in {parent}: {error}") from None
