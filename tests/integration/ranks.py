"""Run a job script as a small local gang, the way the runtime starts each rank: under the
step-timing shim (``runtime/gang/_steptime.py``) with torch's ``env://`` variables and a telemetry
file per rank, on 127.0.0.1. Shared by the tests and ``bench/grad_compression.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "src/aicluster/runtime/gang/_steptime.py"
DDP_MLP = ROOT / "examples/jobs/ddp_mlp.py"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_ranks(
    script: Path,
    args: Sequence[str],
    world_size: int,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 300.0,
) -> list[list[dict[str, Any]]]:
    """Each rank's telemetry records, in rank order. Raises ``RuntimeError`` with the rank's
    output when one exits non-zero."""
    port = free_port()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(world_size):
            processes.append(_start_rank(script, args, rank, world_size, port, workdir, env))
        for rank, process in enumerate(processes):
            code = process.wait(timeout=timeout_s)
            if code != 0:
                output = (workdir / f"rank-{rank}.log").read_text(errors="replace")
                raise RuntimeError(f"rank {rank} exited {code}:\n{output[-4000:]}")
    finally:  # a rank that failed or hung: none of the others outlives the call
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [_records(workdir / f"rank-{rank}.jsonl") for rank in range(world_size)]


def _start_rank(
    script: Path,
    args: Sequence[str],
    rank: int,
    world_size: int,
    port: int,
    workdir: Path,
    env: Mapping[str, str] | None,
) -> subprocess.Popen[bytes]:
    rank_env = {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "AICLUSTER_TELEMETRY_FILE": str(workdir / f"rank-{rank}.jsonl"),
        **(env or {}),
    }
    command = [sys.executable, "-u", str(SHIM), str(script), *args]
    with open(workdir / f"rank-{rank}.log", "wb") as log:  # the child keeps its own copy
        return subprocess.Popen(command, env=rank_env, stdout=log, stderr=log)


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_loss(workdir: Path) -> float:
    """The loss on the whole dataset that ``ddp_mlp.py``'s rank 0 prints when it completes."""
    for line in (workdir / "rank-0.log").read_text().splitlines():
        if line.startswith("final loss "):
            return float(line.split()[2])
    raise AssertionError(f"no final loss in {workdir / 'rank-0.log'}")


def steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for record in records if record.get("kind") == "step"]
