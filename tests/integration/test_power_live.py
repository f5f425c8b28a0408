"""The live control loop with the cluster file's power model and budgets (what ``aicluster up
--cluster FILE`` hands it), on a real store: a job that would put a rack over its budget waits,
and its reason names the budget. (Nothing runs: the job is held back before any launch.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import ManualClock, Tenant, parse_cluster, parse_jobspec
from aicluster.server import main as server_main
from aicluster.store import Store

pytestmark = pytest.mark.integration

# Two racks of one 8-GPU node; a node draws 200 + 8 x 60 = 680 W idle, 240 W more a busy GPU.
# rack-0 may draw 1.5 kW (3 busy GPUs), rack-1 only 0.8 kW (no busy GPU at all).
CLUSTER = """
layout: {racks_per_pod: 2, nodes_per_rack: 1}
power:
  H100: {idle_watts: 60, busy_watts: 300, node_watts: 200}
racks:
  rack-0: {power_budget_w: 1500}
  rack-1: {power_budget_w: 800}
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(tmp_path / "state", clock=ManualClock(1_700_000_000.0))
    opened.create_tenant(Tenant("team-a"), "test")
    opened.upsert_nodes(list(parse_cluster(CLUSTER).nodes))
    try:
        yield opened
    finally:
        opened.close()


def _spec(gpus: int) -> str:
    return f"name: j{gpus}\ntenant: team-a\nentrypoint: t.py\nresources: {{gpus: {gpus}}}\n"


def test_a_live_job_held_back_by_a_rack_budget_says_which(store: Store) -> None:
    cluster = parse_cluster(CLUSTER)
    settings = LoopSettings(power=dict(cluster.power), budgets=cluster.budgets)
    loop = ControlLoop(store, None, None, ManualClock(1_700_000_100.0), settings)
    job, _ = store.submit_job("team-a", parse_jobspec(_spec(4)), "alice")
    loop.tick()
    record = store.get_job(None, job.id)
    assert record.state.value == "PENDING"
    assert record.pending_reason is not None
    assert "power budget rack rack-0: 0.7 of 1.5 kW; starting it would draw 1.6 kW" in (
        record.pending_reason
    )
    assert [node.rack for node in cluster.nodes] == ["rack-0", "rack-1"]


def test_without_the_file_the_same_job_is_admitted(store: Store) -> None:
    loop = ControlLoop(store, None, None, ManualClock(1_700_000_100.0))
    job, _ = store.submit_job("team-a", parse_jobspec(_spec(4)), "alice")
    loop.tick()
    assert store.get_job(None, job.id).state.value != "PENDING"


def test_the_server_refuses_a_bad_cluster_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text("layout: {nodes_per_rack: 1}\nracks:\n  rack-9: {power_budget_w: 10}\n")
    code = server_main(["--state-dir", str(tmp_path), "--cluster", str(bad), "--no-auth"])
    assert code == 2
    assert "c.yaml:1: rack rack-9: no rack named rack-9" in capsys.readouterr().err
