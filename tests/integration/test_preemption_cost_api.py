"""The live cost of preemption over the API: ``GET /v1/cluster`` (``aicluster status``) and
``GET /metrics`` give each caller only its own tenants' figures (tenants are untrusted: a
team-a viewer must not learn team-b's preemptions or lost work), and a cluster admin all.

The plane is a standby (no control loop: nothing races the history written here); its store
holds one preemption per tenant, written as the live loop writes them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from apiserver import RunningServer, open_plane, serve, users
from liveplane import submit
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import JobState, Tenant
from aicluster.store import Role, Store

pytestmark = pytest.mark.integration

#: Tenant b's figure, odd enough that it cannot appear in a's by chance.
B_LOST_GPU_SECONDS = 7_777.0


def preempted(store: Store, tenant: str, kind: str, lost: float) -> str:
    """A job of ``tenant`` admitted, running, preempted by ``kind`` and back in the queue."""
    job_id = submit(store, tenant, f"train-{tenant}", workers=1, gpus=8)
    for to_state in (JobState.STARTING, JobState.RUNNING):
        store.transition(job_id, to_state, "control-loop")
    store.transition(job_id, JobState.PREEMPTING, "control-loop", details={"kind": kind})
    store.transition(job_id, JobState.PENDING, "control-loop", details={"lost_gpu_seconds": lost})
    return job_id


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    plane = open_plane(tmp_path_factory.mktemp("state"))
    store = plane.store
    for name in ("a", "b"):
        store.create_tenant(Tenant(name), "test")
    tokens = users(store, {"alice": ("a", Role.VIEWER), "bob": ("b", Role.MEMBER)})
    preempted(store, "a", "priority", 360.0)
    preempted(store, "b", "reclaim", B_LOST_GPU_SECONDS)
    with serve(plane) as url:
        yield RunningServer(url, plane, tokens)
    store.close()


def cluster_costs(server: RunningServer, who: str) -> dict[str, dict[str, object]]:
    with server.client(who) as client:
        response = client.get("/v1/cluster")
    assert response.status_code == 200, response.text
    costs: dict[str, dict[str, object]] = response.json()["preemption_cost"]
    return costs


def test_the_cluster_summary_gives_each_caller_its_own_tenants_cost(
    server: RunningServer,
) -> None:
    everyone = cluster_costs(server, "admin")
    assert set(everyone) == {"a", "b"}
    assert everyone["b"]["by_kind"] == {"reclaim": 1}
    assert everyone["b"]["lost_gpu_hours"] == pytest.approx(B_LOST_GPU_SECONDS / 3600)
    assert everyone["a"]["by_kind"] == {"priority": 1} and everyone["a"]["preemptions"] == 1
    assert set(cluster_costs(server, "alice")) == {"a"}  # b's cost is not a's to see
    assert set(cluster_costs(server, "bob")) == {"b"}


def test_metrics_give_a_tenant_only_its_own_preemption_series(server: RunningServer) -> None:
    names = (
        "aicluster_preemptions",
        "aicluster_preemption_lost_gpu_seconds",
        "aicluster_admitted_gpu_seconds",
        "aicluster_evictions_per_admitted_gpu_hour",
    )

    def samples(who: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        with server.client(who) as client:
            text = client.get("/metrics").text
        return {
            family.name: [(sample.labels, sample.value) for sample in family.samples]
            for family in text_string_to_metric_families(text)
            if family.name in names
        }

    admin = samples("admin")
    assert set(admin) == set(names)
    assert ({"tenant": "b", "kind": "reclaim"}, B_LOST_GPU_SECONDS) in admin[
        "aicluster_preemption_lost_gpu_seconds"
    ]
    alice = samples("alice")
    assert set(alice) == set(names)
    tenants = {labels["tenant"] for series in alice.values() for labels, _ in series}
    assert tenants == {"a"}
    assert ({"tenant": "a", "kind": "priority"}, 1.0) in alice["aicluster_preemptions"]
    # Every kind has its series from the start, so increase() sees a tenant's first one.
    assert ({"tenant": "a", "kind": "reclaim"}, 0.0) in alice["aicluster_preemptions"]


def test_status_shows_the_cost_of_preemption_per_visible_tenant(server: RunningServer) -> None:
    runner = CliRunner()

    def status(who: str) -> str:
        result = runner.invoke(app, ["status", "--url", server.url, "--token", server.tokens[who]])
        assert result.exit_code == 0, result.output
        return result.output

    shown = status("admin")
    assert "cost of preemption" in shown and "1 reclaim" in shown and "1 priority" in shown
    assert f"{B_LOST_GPU_SECONDS / 3600:,.2f}" in shown
    mine = status("alice")
    assert "1 priority" in mine and "reclaim" not in mine
    assert f"{B_LOST_GPU_SECONDS / 3600:,.2f}" not in mine
