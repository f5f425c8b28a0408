"""Hard limits on a worker's ranks, with the host's cgroups (v2 where its controllers are
delegated to us, v1 otherwise, as on our machines).

A worker's ranks (a rank per GPU) share one memory limit, ``memory_gb`` of the spec's resources
per worker: each worker of a job's attempt gets a cgroup below the node process's own cgroup (so
the host's limits on the node still hold), ``aicluster/<job>.<attempt>.w<worker>``, holding that
limit, and each of its ranks a cgroup nested in it, ``.../r<rank>``, holding the rank's CPU quota
(its share of the worker's ``cpus``) and a process-count limit, with no memory limit of its own.
The memory of the nested cgroups counts in the worker's (v1: hierarchical accounting; v2: the
memory, cpu and pids controllers delegated a level down), so the kernel holds the sum of the
ranks' memory to the worker's. The launcher (root) makes them; the rank's first process joins its
cgroup before the job's code runs (``_child.py --cgroup``, or a warm child through a descriptor
the launcher opened), so everything the job starts stays inside. When the kernel kills a process
of the worker for memory, the cgroups count it (``oom_kill``), and the rank's exit says "exceeded
memory_gb=N", with the worker's peak.

The ranks of one worker start and end on their own (an actor each): :meth:`RankCgroup.make` is
idempotent and safe to run concurrently, and :meth:`RankCgroup.remove` removes the rank's cgroup,
then the worker's where it is empty (the last rank's removal takes it).

Where no cgroup can be made (no controller, or not root), :func:`support` says so and ranks run
with a ``RLIMIT_DATA`` of their share of the worker's memory instead (``--rlimit-data``): it caps
what a process allocates, not what it and its children hold together.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_PIDS",
    "CgroupUnavailable",
    "Limits",
    "RankCgroup",
    "rank_cgroup_name",
    "support",
    "worker_cgroup_name",
]

ROOT = Path("/sys/fs/cgroup")
_V1_CONTROLLERS = ("memory", "cpu", "pids")
_CPU_PERIOD_US = 100_000
#: Times a rank makes its worker's cgroup again when the worker's last other rank removed it.
_NEST_TRIES = 20
#: Where a worker's swap is capped (at none): absent where the host accounts no swap.
_SWAP_FILES = ("memory.swap.max", "memory.memsw.limit_in_bytes")
#: Processes and threads one rank may hold together (torch starts a thread per core and more).
DEFAULT_PIDS = 4096


class CgroupUnavailable(OSError):
    """No cgroup can be made for a rank on this host."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one rank may hold: bytes of memory (in a cgroup its worker's, shared by the worker's
    ranks), CPUs (a quota, fractional allowed) and processes."""

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
        probe = RankCgroup.make(f"probe-{os.getpid()}", "r0", Limits(memory_bytes=1 << 30))
    except OSError as error:
        return f"rlimits (cannot make a cgroup: {error})"
    probe.remove()
    return f"cgroup v{version}"


def worker_cgroup_name(job_id: str, attempt: int, worker: int) -> str:
    """The cgroup of one worker of a job's attempt (its index in the job, as in the rank layout)."""
    return f"{job_id}.{attempt}.w{worker}"


def rank_cgroup_name(rank: int) -> str:
    """A rank's cgroup, inside its worker's."""
    return f"r{rank}"


class RankCgroup:
    """One rank's cgroup inside its worker's: a directory per v1 controller, or one v2 directory,
    each below the worker's (``workers``, in the same order)."""

    def __init__(self, folders: list[Path], workers: list[Path], version: int) -> None:
        self.folders, self.workers, self.version = folders, workers, version

    @classmethod
    def make(cls, worker: str, rank: str, limits: Limits) -> RankCgroup:
        """Make (or reuse) the cgroup ``rank`` inside the worker's cgroup ``worker``: the worker's
        holds ``limits.memory_bytes``, shared by its ranks, the rank's the CPU and process limits.
        Safe while other ranks of the worker make or remove theirs. Raises
        :class:`CgroupUnavailable` (an ``OSError``)."""
        for name in (worker, rank):
            if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
                raise ValueError(f"not a cgroup name: {name!r}")
        version, own = _version(), _own_paths()
        if version == 0:
            raise CgroupUnavailable("no cgroup controllers")
        if version == 2:
            workers = [ROOT / own.get("", "/").lstrip("/") / "aicluster" / worker]
            _enable_v2(workers[0].parent)
        else:
            workers = [
                ROOT / c / own.get(c, "/").lstrip("/") / "aicluster" / worker
                for c in _V1_CONTROLLERS
            ]
        made = cls([folder / rank for folder in workers], workers, version)
        made._nest()
        try:
            made._apply(limits)
        except OSError:
            made.remove()
            raise
        return made

    def _nest(self) -> None:
        """Make the rank's folders, and its worker's where missing. The worker's last other rank
        may remove a worker's folder (empty then) between the two: then again. Once the rank's
        folders exist, the worker's stay (a cgroup with one inside cannot be removed)."""
        for _ in range(_NEST_TRIES):
            try:
                for folder in self.folders:
                    folder.mkdir(parents=True, exist_ok=True)
                return
            except FileNotFoundError:
                continue
        raise CgroupUnavailable(f"the worker's cgroup {self.workers[0]} kept vanishing")

    def _apply(self, limits: Limits) -> None:
        """The limits, once the rank's cgroup holds the worker's (so the worker's limit is written
        into the folder its ranks count in, whichever rank made it). Writing the same limit again
        is harmless: every rank of a worker writes it."""
        if self.version == 2:
            _enable_v2(self.workers[0])  # the ranks' cpu and pids; memory, for their oom_kill
        elif _read(self.workers, "memory.use_hierarchy") == "0":
            raise CgroupUnavailable("memory.use_hierarchy is 0: a worker cannot hold its ranks")
        worker: list[tuple[str, str]] = []
        rank: list[tuple[str, str]] = []
        if self.version == 2:
            if limits.memory_bytes is not None:
                worker += [("memory.max", str(limits.memory_bytes)), ("memory.swap.max", "0")]
            if limits.cpus is not None:
                rank.append(("cpu.max", f"{int(limits.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}"))
        else:
            if limits.memory_bytes is not None:
                # memsw (memory and swap together) as much as memory: no swap. Second: it may
                # never be below memory's limit.
                worker += [
                    ("memory.limit_in_bytes", str(limits.memory_bytes)),
                    ("memory.memsw.limit_in_bytes", str(limits.memory_bytes)),
                ]
            if limits.cpus is not None:
                rank += [
                    ("cpu.cfs_period_us", str(_CPU_PERIOD_US)),
                    ("cpu.cfs_quota_us", str(int(limits.cpus * _CPU_PERIOD_US))),
                ]
        if limits.pids is not None:
            rank.append(("pids.max", str(limits.pids)))
        for file, value in worker:
            _write(self.workers, file, value)
        for file, value in rank:
            _write(self.folders, file, value)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes itself into to join (one per folder)."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this rank, or of its worker, for memory (v1
        counts a kill in the victim's cgroup alone, v2 in its parents too)."""
        for folder in self.folders + self.workers:
            for file, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                with contextlib.suppress(OSError, ValueError):
                    for line in (folder / file).read_text().splitlines():
                        name, _, count = line.partition(" ")
                        if name == key and int(count) > 0:
                            return True
        return False

    def worker_peak_bytes(self) -> int | None:
        """The most memory the worker's ranks held at once, where the kernel tracks it (v1
        ``memory.max_usage_in_bytes``, v2 ``memory.peak`` from Linux 5.19), else None."""
        for file in ("memory.max_usage_in_bytes", "memory.peak"):
            found = _read(self.workers, file)
            if found is not None and found.isdigit():
                return int(found)
        return None

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left in the rank's cgroup and remove it, then the worker's if no other
        rank holds it any more (idempotent)."""
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
        for folder in self.workers:
            # EBUSY while another rank's cgroup is inside: the last rank's removal takes it.
            with contextlib.suppress(OSError):
                folder.rmdir()


def _read(folders: list[Path], file: str) -> str | None:
    """The content of ``file`` in the first of ``folders`` that has it (the controller's)."""
    for folder in folders:
        with contextlib.suppress(OSError):
            return (folder / file).read_text().strip()
    return None


def _write(folders: list[Path], file: str, value: str) -> None:
    """Write ``value`` into ``file`` of the first of ``folders`` that has it."""
    for folder in folders:
        target = folder / file
        if target.exists():
            target.write_text(value)
            return
    if file not in _SWAP_FILES:  # no swap accounting: nothing to cap
        raise CgroupUnavailable(f"no {file} in {folders}")


def _enable_v2(parent: Path) -> None:
    """Delegate the memory, cpu and pids controllers to the cgroups below ``parent``."""
    parent.mkdir(parents=True, exist_ok=True)
    control = parent / "cgroup.subtree_control"
    wanted = " ".join(f"+{name}" for name in _V1_CONTROLLERS)
    try:
        control.write_text(wanted)
    except OSError as error:
        raise CgroupUnavailable(f"cannot delegate controllers in {parent}: {error}") from None
