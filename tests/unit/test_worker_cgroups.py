"""A worker's cgroup and its ranks' inside it, on this host's real cgroups (runtime/sandbox/
cgroups.py): names and nesting, the limits each level holds, a make that is idempotent and safe
while the worker's other ranks come and go, the worker's removal by its last rank, and the
worker's memory shared by its ranks (one rank may take more than an even share; together they
are killed over the worker's limit). Skipped where no cgroup can be made (not root, no
controllers); the end-to-end run with a job is in tests/integration/test_sandbox_limits.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.runtime.sandbox import cgroups
from aicluster.runtime.sandbox.cgroups import (
    Limits,
    RankCgroup,
    rank_cgroup_name,
    worker_cgroup_name,
)

MIB = 1 << 20
SUPPORT = cgroups.support()
# Skipped only off CI: under CI=true (root, cgroup v1, as every machine CI runs on) a host that
# cannot make a cgroup fails these tests rather than passing them unrun.
pytestmark = pytest.mark.skipif(
    not SUPPORT.startswith("cgroup") and os.environ.get("CI") != "true",
    reason=f"no cgroup can be made here: {SUPPORT}",
)

# A rank's process: joins its cgroup (argv[1:] are cgroup.procs files), holds MiB (stdin's
# number), says so, and waits for stdin to close.
HOLDER = """
import os, sys
for procs in sys.argv[1:]:
    with open(procs, "w") as joined:
        joined.write(str(os.getpid()))
held = b"x" * (int(sys.stdin.readline()) << 20)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def worker(request: pytest.FixtureRequest) -> Iterator[str]:
    """A worker's cgroup name of its own (this process, this test); whatever is left of it is
    removed at the end, so a failing test leaks nothing."""
    name = worker_cgroup_name(f"j-test{os.getpid()}", 1, len(request.node.name))
    probe = RankCgroup.make(name, "probe", Limits())
    probe.remove()
    yield name
    for folder in probe.workers:
        for rank in [f for f in folder.iterdir() if f.is_dir()] if folder.exists() else []:
            rank.rmdir()
        if folder.exists():
            folder.rmdir()


def _read(folders: list[Path], file: str) -> str:
    return next((f / file).read_text().strip() for f in folders if (f / file).exists())


def test_names_say_job_attempt_worker_and_rank() -> None:
    assert worker_cgroup_name("j-abc", 2, 1) == "j-abc.2.w1"
    assert rank_cgroup_name(9) == "r9"


def test_a_rank_is_nested_in_its_worker_which_holds_the_memory(worker: str) -> None:
    rank = RankCgroup.make(worker, "r3", Limits(memory_bytes=256 * MIB, cpus=0.5, pids=100))
    try:
        assert [f.parent for f in rank.folders] == rank.workers
        assert all(f.name == "r3" and f.parent.name == worker for f in rank.folders)
        assert all(f.parent.parent.name == "aicluster" for f in rank.folders)
        assert all(f.is_dir() for f in rank.folders)
        if rank.version == 1:
            assert _read(rank.workers, "memory.limit_in_bytes") == str(256 * MIB)
            assert int(_read(rank.folders, "memory.limit_in_bytes")) > 1 << 40  # none of its own
            assert _read(rank.folders, "cpu.cfs_quota_us") == "50000"
            assert _read(rank.workers, "memory.use_hierarchy") == "1"
        else:
            assert _read(rank.workers, "memory.max") == str(256 * MIB)
            assert _read(rank.folders, "memory.max") == "max"
            assert _read(rank.folders, "cpu.max") == "50000 100000"
        assert _read(rank.folders, "pids.max") == "100"
        assert rank.procs_files == [str(f / "cgroup.procs") for f in rank.folders]
    finally:
        rank.remove()


def test_making_twice_is_making_once_and_the_last_rank_removes_the_worker(worker: str) -> None:
    limits = Limits(memory_bytes=128 * MIB)
    first = RankCgroup.make(worker, "r0", limits)
    again = RankCgroup.make(worker, "r0", limits)
    second = RankCgroup.make(worker, "r1", limits)
    assert again.folders == first.folders and second.workers == first.workers
    first.remove()
    first.remove()  # idempotent
    assert not any(f.exists() for f in first.folders)
    assert all(f.is_dir() for f in second.workers)  # its other rank still holds it
    second.remove()
    assert not any(f.exists() for f in second.workers)


def test_ranks_that_come_and_go_at_once_always_sit_in_a_limited_worker(worker: str) -> None:
    """Eight ranks of one worker make and remove their cgroups over and over, at once: each
    make finds its worker holding the limit (never one made again without it), and nothing is
    left once all are gone."""
    limits = Limits(memory_bytes=192 * MIB)
    problems: list[str] = []
    workers: list[Path] = []

    def rank(index: int) -> None:
        for _ in range(25):
            made = RankCgroup.make(worker, f"r{index}", limits)
            workers[:] = made.workers
            if not all(f.is_dir() for f in made.folders):
                problems.append(f"rank {index}: a folder is missing")
            limit = "memory.limit_in_bytes" if made.version == 1 else "memory.max"
            if _read(made.workers, limit) != str(192 * MIB):
                problems.append(f"rank {index}: its worker has no limit")
            made.remove()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert problems == []
    assert workers and not any(f.exists() for f in workers)


def _hold(rank: RankCgroup, mib: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *rank.procs_files],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None
    process.stdin.write(f"{mib}\n")
    process.stdin.flush()
    return process


def _held(process: subprocess.Popen[str]) -> bool:
    """Whether the process holds its memory (False: it died first)."""
    assert process.stdout is not None
    return process.stdout.readline().strip() == "held"


def _end(processes: list[subprocess.Popen[str]]) -> list[int]:
    for process in processes:
        if process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()
    return [process.wait(timeout=30) for process in processes]


def test_one_rank_may_take_more_than_an_even_share_of_its_workers_memory(worker: str) -> None:
    limits = Limits(memory_bytes=160 * MIB)
    big, small = (RankCgroup.make(worker, f"r{i}", limits) for i in range(2))
    try:
        holders = [_hold(big, 100), _hold(small, 4)]  # 100 MiB: over an even share of 80
        assert all(_held(holder) for holder in holders)
        assert _end(holders) == [0, 0]
        assert not big.oom_killed() and not small.oom_killed()
        peak = big.worker_peak_bytes()
        assert peak is None or peak > 100 * MIB
    finally:
        big.remove()
        small.remove()


def test_ranks_over_their_workers_memory_together_are_killed_and_it_is_counted(
    worker: str,
) -> None:
    limits = Limits(memory_bytes=128 * MIB)
    ranks = [RankCgroup.make(worker, f"r{i}", limits) for i in range(2)]
    try:
        first = _hold(ranks[0], 80)
        assert _held(first)
        second = _hold(ranks[1], 80)  # 160 MiB together, each under 128
        _held(second)
        codes = _end([first, second])
        assert -9 in codes, codes  # SIGKILL, from the kernel's OOM killer
        assert all(rank.oom_killed() for rank in ranks) or ranks[0].version == 1
        assert any(rank.oom_killed() for rank in ranks)
        peak = ranks[0].worker_peak_bytes()
        assert peak is None or peak > 120 * MIB
    finally:
        for rank in ranks:
            rank.remove()
    assert not any(f.exists() for f in ranks[0].workers)
