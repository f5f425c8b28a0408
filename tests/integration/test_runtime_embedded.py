"""The detached embedded cluster ``aicluster up`` uses: start, join from another process, stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aicluster.runtime import embedded_topology, read_detached, start_detached, stop_detached

pytestmark = pytest.mark.integration

DISCOVER = (
    "import json, sys; from aicluster.runtime import connect, discover; "
    "connect(sys.argv[1]); view = discover(); "
    "print(json.dumps({n.name: [n.rack, n.gpus] for n in view.cluster.nodes}))"
)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(line) for line in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


def test_detached_cluster_outlives_its_starter_and_stops_cleanly(tmp_path: Path) -> None:
    started = start_detached(tmp_path, embedded_topology(nodes=2, gpus_per_node=4))
    try:
        assert start_detached(tmp_path) == started  # idempotent
        assert read_detached(tmp_path) == started
        ray_processes = _children(started.pid)
        assert ray_processes
        out = subprocess.run(
            [sys.executable, "-c", DISCOVER, started.address],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        nodes = json.loads(out.stdout.strip().splitlines()[-1])
        assert nodes == {"node-0": ["rack-0", 4], "node-1": ["rack-0", 4]}
    finally:
        assert stop_detached(tmp_path)
    assert read_detached(tmp_path) is None
    assert not stop_detached(tmp_path)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in ray_processes):
        assert time.monotonic() < deadline, "Ray processes outlived the detached cluster"
        time.sleep(0.5)
