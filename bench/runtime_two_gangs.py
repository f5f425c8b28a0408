"""Two tenants' tiny_gpt jobs at once on the embedded 4-node cluster: wall time and loss.

Prints figures (no assertions): cluster start, launch latency, steps per second and first/last
loss of each job, and the total. ``python bench/runtime_two_gangs.py [--steps 300]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from aicluster.core import DomainLevel, Placement, Slot
from aicluster.runtime import EmbeddedCluster, GangSpec, Runtime, embedded_topology

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    options = parser.parse_args()
    began = time.monotonic()
    with EmbeddedCluster(embedded_topology(4, 8)) as cluster, tempfile.TemporaryDirectory() as d:
        cluster.connect()
        print(f"cluster of 4 nodes up in {time.monotonic() - began:.1f}s")
        runtime = Runtime(d)
        handles = []
        jobs = (("team-a-gpt", ("node-0", "node-1"), 1), ("team-b-gpt", ("node-2", "node-3"), 2))
        for job, nodes, seed in jobs:
            # 4 ranks as tiny_gpt.yaml runs them: a GPU each, 2 a node (a rank per GPU).
            slots = tuple(Slot(node, 1) for node in nodes for _ in range(2))
            spec = GangSpec(
                job_id=job,
                entrypoint="examples/jobs/tiny_gpt.py",
                args=("--steps", str(options.steps), "--seed", str(seed)),
                placement=Placement(slots, DomainLevel.RACK, "rack"),
                workers=4,
                gpus_per_worker=1,
                env={"OMP_NUM_THREADS": "1"},
                working_dir=str(REPO),
            )
            launched = time.monotonic()
            handles.append(runtime.launch(spec))
            print(f"{job}: launched in {time.monotonic() - launched:.1f}s on {nodes}")
        run_began = time.monotonic()
        for handle in handles:
            status = handle.wait(timeout_s=900)
            steps = [r for r in handle.telemetry()[0] if r.kind == "step"]
            times = sorted(r.step_time or 0.0 for r in steps[1:])
            print(
                f"{handle.job_id}: {status.phase.value} after {time.monotonic() - run_began:.1f}s; "
                f"loss {steps[0].loss:.3f} -> {steps[-1].loss:.3f}; "
                f"median step {times[len(times) // 2]:.3f}s"
            )
            handle.stop()
    print(f"total {time.monotonic() - began:.1f}s")


if __name__ == "__main__":
    main()
