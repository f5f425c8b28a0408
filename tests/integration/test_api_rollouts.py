"""The rollout routes' rules on a real server and store, without Ray: a plan is validated (422
with the reason), an unknown version or rollout is a 404, a viewer reads but cannot start one,
another tenant sees and changes nothing (404), a second rollout while one runs is a 409; a
member promotes or aborts one by hand.

Starting a rollout writes only the store (the serving leader moves it along), so these rules need
no Serve replica; the rollouts that move real traffic run on Ray in ``test_rollouts.py``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from apiserver import RunningServer, serve_tenants
from modelkit import write_export

from aicluster.core import Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

PATH = "/v1/models/guarded/rollouts"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Tenant a serves model ``guarded`` version 1 and has version 2 registered."""
    state_dir = tmp_path_factory.mktemp("rollouts-api")
    grants = {"alice": ("a", Role.MEMBER), "vera": ("a", Role.VIEWER), "bob": ("b", Role.MEMBER)}
    tenants = [Tenant("a"), Tenant("b")]
    with serve_tenants(str(state_dir), state_dir, tenants, grants) as running:
        store = running.plane.store
        for name, versions in (("guarded", 2), ("manual", 3)):
            for version in range(1, versions + 1):
                store.register_model_version(
                    "a",
                    name,
                    source_dir=write_export(state_dir / f"export-{name}-{version}"),
                    job_id=None,
                    spec_hash=None,
                    code_version="0" * 64,
                    dataset_hash=None,
                    metrics={},
                    registered_by="alice",
                )
            store.put_deployment("a", name, {"replicas": 1}, {1: 100.0}, "alice")
        yield running


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"version": 2, "steps": [50, 10, 100]}, "strictly increasing"),
        ({"version": 2, "steps": [10, 50]}, "last step must be 100"),
        ({"version": 2, "interval_s": 0.5}, "at least 1 s"),
        ({"version": 2, "max_error_rate": 5}, "error rate must be in [0, 1]"),
        ({"version": "two"}, "version"),
    ],
)
def test_a_bad_plan_is_a_422_with_its_reason(
    server: RunningServer, body: dict[str, object], message: str
) -> None:
    with server.client("alice") as client:
        response = client.post(PATH, json=body)
    assert response.status_code == 422 and message in response.text, response.text


def test_unknown_versions_and_rollouts_are_404(server: RunningServer) -> None:
    with server.client("alice") as client:
        assert client.post(PATH, json={"version": 99}).status_code == 404
        assert client.get(f"{PATH}/999999").status_code == 404
        assert client.post("/v1/models/nothing/rollouts", json={"version": 2}).status_code == 404


def test_a_rollout_is_the_tenants_own_and_one_at_a_time(server: RunningServer) -> None:
    with server.client("vera") as viewer:
        assert viewer.get(PATH).status_code == 200
        assert viewer.post(PATH, json={"version": 2}).status_code == 403
    with server.client("alice") as client:
        started = client.post(PATH, json={"version": 2, "interval_s": 600})
        assert started.status_code == 201, started.text
        rollout = started.json()
        assert (rollout["from_version"], rollout["to_version"], rollout["weight"]) == (1, 2, 0)
    with server.client("bob") as other:
        assert other.get(PATH).status_code == 404
        assert other.get(f"{PATH}?tenant=a").status_code == 404
        assert other.get(f"{PATH}/{rollout['id']}").status_code == 404
        assert other.post(PATH, json={"version": 2}).status_code == 404
        assert other.post(f"{PATH}/current/promote").status_code == 404
        assert other.post(f"{PATH}/current/abort").status_code == 404
    with server.client("alice") as client:
        assert (
            client.get(f"{PATH}/{rollout['id']}").json()["state"] == "running"
        )  # bob changed nothing
        assert client.post(PATH, json={"version": 2}).status_code == 409
        aborted = client.post(f"{PATH}/current/abort")
        assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
        listed = client.get(PATH).json()
        assert [(r["id"], r["state"]) for r in listed] == [(rollout["id"], "aborted")]
        deployment = client.get("/v1/deployments/guarded").json()
    weights = {int(v["version"]): float(v["weight"]) for v in deployment["versions"]}
    assert weights.get(1) == 100.0 and not weights.get(2)


def _weights(client: httpx.Client, name: str) -> dict[int, float]:
    deployment = client.get(f"/v1/deployments/{name}").json()
    return {int(v["version"]): float(v["weight"]) for v in deployment["versions"]}


def test_a_member_promotes_or_aborts_a_rollout_by_hand(server: RunningServer) -> None:
    """Promote sends all traffic to the new version, abort back to the old one, each at once
    (the serving leader then moves the replicas: ``test_rollouts.py``); the steps between are
    the controller's (``test_rollout_controller.py::test_manual_promote_and_abort``)."""
    path = "/v1/models/manual/rollouts"
    with server.client("alice") as client:
        first = client.post(path, json={"version": 2, "interval_s": 600})
        assert first.status_code == 201, first.text
        promoted = client.post(f"{path}/current/promote")
        assert promoted.status_code == 200, promoted.text
        assert (promoted.json()["id"], promoted.json()["state"]) == (first.json()["id"], "promoted")
        assert _weights(client, "manual") == {2: 100.0}
        again = client.post(f"{path}/current/abort")
        assert again.status_code == 404 and "no rollout in progress" in again.json()["error"]
        second = client.post(path, json={"version": 3, "interval_s": 600})
        assert second.status_code == 201 and second.json()["from_version"] == 2, second.text
        aborted = client.post(f"{path}/current/abort")
        assert aborted.status_code == 200 and aborted.json()["state"] == "aborted"
        assert _weights(client, "manual") == {2: 100.0}
        assert [r["state"] for r in client.get(path).json()] == ["aborted", "promoted"]
