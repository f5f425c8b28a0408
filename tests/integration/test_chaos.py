"""Chaos on the embedded 4-node cluster: a 4-worker job keeps training through five killed
worker processes and one killed Ray node, loses at most one checkpoint interval each time, and
ends with the loss of the same run without failures.
Its ranks run in its tenant's sandbox (warm starts included), as `aicluster up` runs them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from chaos import reference_losses, run_chaos

from aicluster.runtime import EmbeddedCluster, Runtime
from aicluster.runtime.sandbox.bwrap import SandboxConfig, probe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A failure every 20 steps (six by step 120) in a 160-step run of 0.1 s steps: each failure
# still costs a restart of seconds against a checkpoint every second, and a step takes 0.4-0.5 s
# beside the rest of the suite (174 s for 220 steps, failures every 30, in a run of 1fc6e32).
STEPS, CHECKPOINT_EVERY, EVERY = 160, 10, 20
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_a_job_survives_killed_workers_and_a_lost_node(
    ray_cluster: EmbeddedCluster, runtime: Runtime, tmp_path: Path
) -> None:
    # Sandboxed where bubblewrap runs, and always under CI=true (where it must run).
    sandboxed_here = probe() is None or os.environ.get("CI") == "true"
    sandbox = SandboxConfig() if sandboxed_here else None
    sandboxed = Runtime(runtime.state_dir, start_timeout_s=60, sandbox=sandbox)
    result = run_chaos(
        ray_cluster,
        sandboxed,
        tmp_path / "state",
        steps=STEPS,
        step_sleep=0.1,
        checkpoint_every=CHECKPOINT_EVERY,
        every=EVERY,
        process_kills=5,
        seed=1,
    )
    # The failure-free run of the same seed: a resume restores the model, optimizer, RNG and
    # data position (bit-identical in test_checkpoint_kill), so the job must end with its loss,
    # to float rounding (four runs ended 1e-9 to 6e-9 apart).
    result.reference_losses = reference_losses(runtime, STEPS, [1], tmp_path)
    report = {
        "state": result.state,
        "failures": [
            {
                "kind": f.kind,
                "last_step": f.last_step,
                "resumed_step": f.resumed_step,
                "lost_steps": f.lost_steps,
                "recovery_s": f.recovery_s,
            }
            for f in result.failures
        ],
        "median_recovery_s": result.median_recovery_s,
        "final_loss": result.final_loss,
        "reference_losses": result.reference_losses,
        "goodput": result.goodput,
        "wall_s": result.wall_s,
    }
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    assert result.state == "SUCCEEDED"
    if sandbox is not None:  # restarts fork from the tenant's warm process there too
        assert sum(f.warm_ranks for f in result.failures) > 0, result.failures
    assert [f.kind for f in result.failures].count("node") == 1
    assert len(result.failures) == 6
    for failure in result.failures:
        assert failure.lost_steps is not None, f"never resumed after {failure}"
        assert failure.lost_steps <= CHECKPOINT_EVERY, failure
    (reference,) = result.reference_losses
    assert result.final_loss is not None
    assert abs(result.final_loss - reference) <= 1e-6, (result.final_loss, reference)
