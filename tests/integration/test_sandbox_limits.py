"""The tenant sandbox's limits, enforced by the kernel: a job over its memory fails with that
reason while its neighbour finishes; a worker's ranks share its ``memory_gb`` (a cgroup per
worker); a job over its disk cap is stopped by its own file system's ENOSPC.

One sandboxed control-plane server on the session's Ray cluster, as in ``test_sandbox.py`` (the
attacks on the sandbox); the limits are a room of their own, and a file of their own keeps each
under the per-file budget. The jobs import nothing of aicluster (``sandbox_job/``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverproc import SANDBOX_REQUIRED, sandboxed_server

from aicluster.runtime import RunDir

# Where bubblewrap cannot run, these skip locally and FAIL under CI=true (SANDBOX_REQUIRED).
pytestmark = [pytest.mark.integration, SANDBOX_REQUIRED]

JOB_FOLDER = Path(__file__).parent / "sandbox_job"
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")
DISK_GB = 0.05  # each job's data directory: far more than the other jobs here write
TENANTS = {"team-a": {"quota": {"sim-gpu": 16}}, "team-b": {"quota": {"sim-gpu": 8}}}


@pytest.fixture(scope="module")
def sandboxed(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    work = tmp_path_factory.mktemp("sandbox-limits")
    disk = ("--job-disk-gb", str(DISK_GB))
    with sandboxed_server("limits", ray_cluster.address, work, TENANTS, disk) as server:
        yield server, ray_cluster


def test_a_job_over_its_memory_fails_with_that_reason_and_its_neighbour_finishes(
    sandboxed: Any,
) -> None:
    server, _ = sandboxed
    carol, dave = server.create_member("carol", "team-a"), server.create_member("dave", "team-b")
    neighbour = server.submit(dave, JOB_FOLDER / "neighbour.yaml")
    hog = server.submit(carol, JOB_FOLDER / "hog.yaml")
    ended = ("SUCCEEDED", "FAILED", "CANCELLED")
    server.wait_for(lambda: server.job(hog)["state"] in ended, 180, "the hog to end")
    server.wait_for(lambda: server.job(neighbour)["state"] in ended, 180, "the neighbour")
    hogged = server.job(hog)
    assert hogged["state"] == "FAILED", hogged
    assert "exceeded memory_gb=0.5" in hogged["exit_message"], hogged["exit_message"]
    assert "never limited" not in RunDir(server.state_dir, hog, 1).read_log(0).text
    assert server.job(neighbour)["state"] == "SUCCEEDED"


def test_a_workers_ranks_share_its_memory(sandboxed: Any) -> None:
    """``memory_gb`` is the worker's, shared by its ranks (a cgroup per worker, its ranks'
    inside): 2 workers of 8 GPUs with 4 GB each, whose ranks together take 3 GB a worker (rank 0
    1 GiB, twice an even share), SUCCEED; a worker of 4 GPUs with 1 GB whose ranks take 400 MiB
    each FAILS, with the worker, its limit and its peak. No cgroup of either is left."""
    server, _ = sandboxed
    ivan = server.create_member("ivan", "team-a")
    shared = server.submit(ivan, JOB_FOLDER / "sharer.yaml")
    overshared = server.submit(ivan, JOB_FOLDER / "oversharer.yaml")
    for job in (shared, overshared):
        server.wait_for(lambda j=job: server.job(j)["state"] in ENDED, 180, "the sharers to end")
    record = server.job(shared)
    assert record["state"] == "SUCCEEDED", (record, RunDir(server.state_dir, shared, 1).read_log(0))
    record = server.job(overshared)
    assert record["state"] == "FAILED", record
    said = r"exceeded memory_gb=1 \(worker 0 of 1 on node-\d: peak (1\.0|0\.9\d) GB\)"
    assert re.search(said, record["exit_message"]), record["exit_message"]

    def left() -> list[Path]:  # the failed job's other ranks are stopped after it is FAILED
        jobs = (f"{shared}.", f"{overshared}.")
        return [f for f in Path("/sys/fs/cgroup").glob("**/aicluster/*") if f.name.startswith(jobs)]

    server.wait_for(lambda: not left(), 30, "the sharers' cgroups to go")


def test_a_job_over_its_disk_cap_is_stopped_by_the_kernel(sandboxed: Any) -> None:
    """The job's data directory is a file system of DISK_GB of its own (runtime/sandbox/jobdisk.py):
    the write past it fails with ENOSPC, the job fails with the cap as its reason, and once it
    has ended its files are back in a plain directory, the mount and the image gone."""
    server, _ = sandboxed
    health = server.health()
    assert health is not None and health["disk_limit"] == "loop", health
    frank = server.create_member("frank", "team-a")
    job = server.submit(frank, JOB_FOLDER / "filler.yaml")
    run = RunDir(server.state_dir, job, 1)
    data_dir = os.path.realpath(run.data_dir_for("team-a"))
    server.wait_for(lambda: os.path.ismount(data_dir), 120, "the filler's disk")
    server.wait_for(lambda: server.job(job)["state"] in ENDED, 180, "the filler to end")
    record = server.job(job)
    assert record["state"] == "FAILED", record
    assert f"exceeded disk_gb={DISK_GB:g}" in record["exit_message"], record["exit_message"]
    assert "No space left on device" in run.read_log(0, "stderr").text  # the kernel's ENOSPC
    assert "never stopped" not in run.read_log(0).text
    image = server.state_dir / "jobdisks" / f"{job}.img"
    server.wait_for(lambda: not image.exists(), 60, "the filler's image to be given back")
    assert not os.path.ismount(data_dir)
    assert Path(data_dir, "1", "fill-0.bin").stat().st_size == 10 << 20  # copied back
