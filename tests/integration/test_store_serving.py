"""Deployments in the store, on real SQLite and PostgreSQL: create, rolling-update marker,
traffic changes with validation, delete, events, tenant scoping."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.core import ManualClock, Tenant
from aicluster.store import NotFound, StaleState, Store

pytestmark = pytest.mark.integration
META = {"format": 1, "entrypoint": "m.py:load", "config": {}, "metrics": {}}


@pytest.fixture
def store(store_url: str, clock: ManualClock, tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(store_url, clock=clock, state_dir=tmp_path / "state")
    for tenant in ("a", "b"):
        opened.create_tenant(Tenant(tenant), "admin")
    for version in (1, 2, 3):
        source = tmp_path / f"v{version}"
        (source / "code").mkdir(parents=True)
        (source / "code" / "m.py").write_text("def load(w, c):\n    return None\n")
        (source / "weights.safetensors").write_bytes(b"w")
        (source / "model.json").write_text(json.dumps(META))
        opened.register_model_version(
            "a",
            "gpt",
            source_dir=source,
            job_id=None,
            spec_hash=None,
            code_version="c",
            dataset_hash=None,
            metrics={},
            registered_by="alice",
        )
    try:
        yield opened
    finally:
        opened.close()


def test_put_get_list_and_idempotence(store: Store) -> None:
    created = store.put_deployment("a", "gpt", {"replicas": 2}, {1: 100}, "alice")
    assert (created.traffic, created.replicas, created.version) == ({1: 100.0}, (2, 2), 1)
    assert store.get_deployment("a", "gpt") == created
    again = store.put_deployment("a", "gpt", {"replicas": 2}, {1: 100}, "alice")
    assert again.version == 1  # nothing changed: no new row version, no event
    kinds = [e.kind for e in store.audit("a") if e.kind.startswith("deployment.")]
    assert kinds == ["deployment.put"]
    assert [d.name for d in store.list_deployments("a")] == ["gpt"]
    assert store.list_deployments("b") == []
    assert (created.cpus, created.memory_gb) == (1.0, 1.0)  # a replica's defaults
    bigger = store.put_deployment(
        "a", "gpt", {"replicas": 2}, {1: 100}, "alice", cpus=2.5, memory_gb=4.0
    )
    assert (bigger.version, bigger.cpus, bigger.memory_gb) == (2, 2.5, 4.0)
    assert store.get_deployment("a", "gpt") == bigger
    put = [e for e in store.audit("a") if e.kind == "deployment.put"][-1]
    assert (put.details["cpus"], put.details["memory_gb"]) == (2.5, 4.0)
    with pytest.raises(NotFound):
        store.get_deployment("b", "gpt")  # another tenant's deployment does not exist


def test_traffic_changes_are_validated_logged_and_cancel_a_promotion(store: Store) -> None:
    store.put_deployment("a", "gpt", {"replicas": 1}, {1: 100}, "alice")
    rolling = store.put_deployment(
        "a", "gpt", {"replicas": 1, "promote_when_healthy": 2}, {1: 100, 2: 0}, "alice"
    )
    assert rolling.promote_to == 2 and rolling.versions == [1, 2]
    for bad in ({1: 50, 2: 40}, {1: 120, 2: -20}):
        with pytest.raises(ValueError):
            store.set_traffic("a", "gpt", bad, "bob")
    with pytest.raises(NotFound):
        store.set_traffic("a", "gpt", {1: 50, 9: 50}, "bob")  # no version 9 registered
    with pytest.raises(StaleState):
        store.set_traffic("a", "gpt", {2: 100}, "bob", expected_version=rolling.version - 1)
    moved = store.set_traffic("a", "gpt", {1: 90, 2: 10}, "bob", reason="canary 10%")
    assert moved.traffic == {1: 90.0, 2: 10.0} and moved.promote_to is None
    event = [e for e in store.audit("a") if e.kind == "deployment.traffic"][-1]
    assert event.actor == "bob" and event.details["reason"] == "canary 10%"
    assert event.details["from"] == {"1": 100.0, "2": 0.0}
    assert event.details["to"] == {"1": 90.0, "2": 10.0}


def test_registry_and_tenant_checks(store: Store) -> None:
    with pytest.raises(NotFound):
        store.put_deployment("b", "gpt", {"replicas": 1}, {1: 100}, "eve")  # b has no gpt
    with pytest.raises(NotFound):
        store.put_deployment("a", "gpt", {"replicas": 1}, {7: 100}, "alice")
    with pytest.raises(ValueError):
        store.put_deployment("a", "gpt", {"replicas": 0}, {1: 100}, "alice")
    with pytest.raises(ValueError, match="cpus must be above 0"):
        store.put_deployment("a", "gpt", {"replicas": 1}, {1: 100}, "alice", cpus=0)


def test_delete_then_deploy_again(store: Store) -> None:
    store.put_deployment("a", "gpt", {"replicas": 1}, {1: 100}, "alice")
    deleted = store.delete_deployment("a", "gpt", "alice")
    assert deleted.state == "deleted"
    assert store.list_deployments(None) == []
    with pytest.raises(NotFound):
        store.delete_deployment("a", "gpt", "alice")
    back = store.put_deployment("a", "gpt", {"replicas": 1}, {3: 100}, "alice")
    assert back.state == "active" and back.traffic == {3: 100.0}
    kinds = [e.kind for e in store.audit("a") if e.kind.startswith("deployment.")]
    assert kinds == ["deployment.put", "deployment.deleted", "deployment.put"]
