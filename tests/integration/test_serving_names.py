"""Names across tenants, end to end: tenants whose names met in the system's names before
(``a-b``, ``a_b``, ``a.b``, ``A-b``: ``-``, ``_`` and ``.`` folded, and case) each register and
deploy a model of the same name on one real Ray cluster (a server process, Ray Serve replicas,
real HTTP); each tenant's route answers with that tenant's own model, each version has its own
Serve application, registry directory and tenant folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import ServingServer, mlp_inputs, register_mlp, replicas, serving_server

from aicluster.core import names
from aicluster.runtime.rundir import tenant_dir
from aicluster.serve import app_name

pytestmark = pytest.mark.timeout(600)

#: All four made ``aic-a_b--m-v1`` (or ``aic-A_b--m-v1``) before; a model of the same name each.
TENANTS = ("a-b", "a_b", "a.b", "A-b")
MODEL = "m"


@pytest.fixture(scope="module")
def server(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingServer]:
    work = tmp_path_factory.mktemp("serving-names")
    with serving_server(ray_cluster.address, work, tenants=TENANTS) as running:
        yield running


def test_same_model_name_in_confusable_tenants_serves_each_its_own(
    server: ServingServer, tmp_path: Path
) -> None:
    # Each tenant's model answers with its own tag (the models' outputs differ).
    versions = {t: register_mlp(server.store, t, MODEL, tmp_path, tag=f"own-{t}") for t in TENANTS}
    assert set(versions.values()) == {1}  # the same (name, version) in every tenant
    records = {t: server.store.get_model_version(t, MODEL, 1) for t in TENANTS}
    folders = {t: record.artifact_dir for t, record in records.items()}
    assert len(set(folders.values())) == len(TENANTS), folders
    state = server.work_dir / "state"
    for tenant, folder in folders.items():
        expected = state / "models" / names.part(tenant) / names.part(MODEL) / "1"
        assert folder == expected.resolve(), (tenant, folder)
    assert len({tenant_dir(state, t) for t in TENANTS}) == len(TENANTS)

    for tenant in TENANTS:
        out = server.deploy(f"user-{tenant}", MODEL, 1, replicas=1)
        assert out["tenant"] == tenant
        assert out["endpoint"].endswith(f"/v1/models/{MODEL}/predict?tenant={tenant}")
    apps = {t: app_name(t, MODEL, 1) for t in TENANTS}
    assert len(set(apps.values())) == len(TENANTS), apps
    for tenant in TENANTS:
        server.wait_serving(f"user-{tenant}", MODEL, 1, timeout_s=240)

    # Every tenant's version runs in a Serve application of its own.
    for tenant, app in apps.items():
        assert len(replicas(app)) == 1, (tenant, app)

    # Each tenant's members reach their own model, by the bare route and by the tenant's route.
    for tenant in TENANTS:
        for path in (f"/v1/models/{MODEL}/predict", f"/v1/models/{MODEL}/predict?tenant={tenant}"):
            with server.client(f"user-{tenant}") as client:
                answer = client.post(path, json=mlp_inputs())
            assert answer.status_code == 200, (tenant, path, answer.text)
            body = answer.json()
            assert body["outputs"]["tag"] == f"own-{tenant}", (tenant, body)
            assert body["model"] == MODEL and body["version"] == 1

    # An admin sees all four: the bare route is ambiguous, each tenant's route is its own.
    with server.client() as admin:
        ambiguous = admin.post(f"/v1/models/{MODEL}/predict", json=mlp_inputs())
        assert ambiguous.status_code == 422 and "add ?tenant=" in ambiguous.text
        for tenant in TENANTS:
            answer = admin.post(
                f"/v1/models/{MODEL}/predict", params={"tenant": tenant}, json=mlp_inputs()
            )
            assert answer.status_code == 200, (tenant, answer.text)
            assert answer.json()["outputs"]["tag"] == f"own-{tenant}"
        shown = {(d["tenant"], d["name"]) for d in admin.get("/v1/deployments").json()}
        assert shown == {(t, MODEL) for t in TENANTS}

    # A tenant cannot reach a confusable neighbour's model through the neighbour's route.
    with server.client("user-a-b") as client:
        other = client.post(f"/v1/models/{MODEL}/predict?tenant=a_b", json=mlp_inputs())
        assert other.status_code == 404, other.text
