"""The gang watch expects a report from every rank the launcher started (a rank per GPU), not
from every worker: on a real SQLite store and a real run directory, without Ray. (The spec asks
for every rank's first step within the grace, ``hang_check: from_start``: by default a rank is
watched only once it said it steps, see ``test_control_health.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.control.loop.faults import JobFaults
from aicluster.control.loop.gangwatch import GangWatch
from aicluster.control.loop.health import HealthConfig
from aicluster.control.settings import LoopSettings
from aicluster.core import DomainLevel, Placement, Slot, Tenant, jobspec_from_mapping
from aicluster.runtime import GangHandle, GangSpec, RunDir, rank_layout
from aicluster.runtime.rundir import write_json_atomic
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from aicluster.train.telemetry import TelemetryWriter


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path)
    opened.create_tenant(Tenant("a"), "test")
    yield opened
    opened.close()


def test_a_gang_is_hung_until_every_rank_of_every_gpu_has_stepped(
    store: Store, tmp_path: Path
) -> None:
    spec = jobspec_from_mapping(
        {
            "name": "j",
            "entrypoint": "train.py",
            "workers": 2,
            "resources": {"gpus": 2},
            "hang_check": "from_start",
        }
    )
    record, _ = store.submit_job("a", spec, "tester")
    placement = Placement((Slot("n0", 2), Slot("n1", 2)), DomainLevel.RACK, "r0")
    gang = GangSpec(record.id, "train.py", placement, workers=2, gpus_per_worker=2, attempt=1)
    run = RunDir(tmp_path, record.id, 1)
    run.make_data_dir("a", None)
    ranks = [{"rank": s.rank, "node": s.node} for s in rank_layout(placement, 2, 2)]
    write_json_atomic(run.spec_file, {**gang.to_dict(), "ranks": ranks})
    for rank in (0, 1):  # the first worker's two ranks step; the second worker's never do
        writer = TelemetryWriter(run.telemetry_file(rank), rank, "n0", 1)
        writer.write("step", step=1, loss=1.0, step_time=0.1)
        writer.close()
    watch = GangWatch(store, JobFaults(store, "test", lambda: 0.0), lambda *_: None)
    settings = LoopSettings(SchedulerConfig(), health=HealthConfig(startup_grace_s=60))
    handle = GangHandle(str(tmp_path), record.id, 1)
    assert watch.observe(record, handle, 0.0, settings) is None  # still starting up
    hung = watch.observe(record, handle, 61.0, settings)
    assert hung is not None and hung.startswith("rank 2 made no first step 61s after")
