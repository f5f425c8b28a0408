"""A real tiny_gpt job on the 4-node Ray cluster: it trains a few steps, exports, succeeds, and
the control loop registers its model with lineage; the registered copy answers a prompt."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from shipping import ship

from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.runtime import Runtime, discover
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from aicluster.store.base import WallClock
from aicluster.train.export import file_sha256, load_predictor, tree_sha256

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TINY_GPT = REPO / "examples" / "jobs" / "tiny_gpt.py"
DATA = REPO / "examples" / "data" / "coriolanus.txt"


def test_a_trained_tiny_gpt_is_registered_and_answers(runtime: Runtime, tmp_path: Path) -> None:
    store = Store.open(tmp_path / "state")
    store.create_tenant(Tenant("a"), "test")
    settings = LoopSettings(SchedulerConfig(queue="priority"))
    loop = ControlLoop(store, runtime, discover, WallClock(), settings)
    spec = jobspec_from_mapping(
        {
            "name": "tiny-gpt",
            "entrypoint": "jobs/tiny_gpt.py",
            "code": ship(runtime.state_dir, "a", REPO / "examples"),
            "args": ["--steps", "6", "--batch-size", "4", "--block", "16", "--width", "32"],
            "workers": 2,
            "resources": {"gpus": 1, "cpus": 0.1, "memory_gb": 0.1},
            "env": {"OMP_NUM_THREADS": "1"},
            "model": {"name": "shakespeare"},
        }
    )
    job, _ = store.submit_job("a", spec, "tester")
    try:
        deadline = time.monotonic() + 240
        while store.get_job(None, job.id).state not in (JobState.SUCCEEDED, JobState.FAILED):
            assert time.monotonic() < deadline, "the job did not finish"
            loop.tick()
            time.sleep(0.3)
        done = store.get_job(None, job.id)
        assert done.state is JobState.SUCCEEDED, done.exit_message
        (version,) = store.list_model_versions("a", "shakespeare")
        events = [e.kind for e in store.events(job.id)]
    finally:
        handle = runtime.gang(job.id)
        if handle is not None:
            handle.stop(1)
        loop.launcher.shutdown()
        store.close()
    assert (version.version, version.job_id, version.registered_by) == (1, job.id, "tester")
    assert version.spec_hash == job.spec_hash
    assert version.code_version == tree_sha256(version.artifact_dir / "code")
    assert (version.artifact_dir / "code" / "tiny_gpt.py").read_bytes() == TINY_GPT.read_bytes()
    assert version.dataset_hash == file_sha256(DATA)
    assert set(version.metrics) == {"loss", "val_loss"} and version.metrics["loss"] > 0
    assert version.meta["config"]["width"] == 32 and version.meta["drift"]["feature"] == "prompt"
    assert "model.registered" in events and "model.register_failed" not in events
    predictor = load_predictor(version.artifact_dir)
    answer = predictor.predict({"prompt": "First Citizen:\n", "max_new_tokens": 8})
    assert len(answer["completion"]) == 8
    assert set(answer["completion"]) <= set(version.meta["config"]["vocab"])
    assert predictor.predict({"prompt": "First Citizen:\n", "max_new_tokens": 8}) == answer
