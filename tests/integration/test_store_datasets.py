"""Datasets in the store, on SQLite and PostgreSQL: versions, the data quota, retention, the
versions a job reads, and tenants kept apart."""

from __future__ import annotations

from typing import Any

import pytest

from aicluster.core import JobState, ManualClock, Tenant, jobspec_from_mapping
from aicluster.store import Conflict, DataPolicy, DataQuotaExceeded, NotFound, Store

pytestmark = pytest.mark.integration

DAY = 86_400.0


def _manifest(*shards: tuple[str, int]) -> dict[str, Any]:
    files = [
        {"path": f"f{index}", "size": size, "pieces": [[index, 0, size]]}
        for index, (_, size) in enumerate(shards)
    ]
    return {"format": 1, "files": files, "shards": [{"sha256": s, "size": n} for s, n in shards]}


def _push(store: Store, tenant: str, name: str, *shards: tuple[str, int], quota: int = 10**9):
    return store.create_dataset_version(
        tenant, name, _manifest(*shards), "d" * 64, "alice", default_quota=quota
    )


@pytest.fixture
def tenants(store: Store) -> Store:
    for name in ("a", "b"):
        store.create_tenant(Tenant(name, quota={"H100": 8}), "test")
    return store


def test_versions_count_up_and_show_their_jobs(tenants: Store) -> None:
    store = tenants
    first, _ = _push(store, "a", "ds", ("1" * 64, 10))
    second, _ = _push(store, "a", "ds", ("1" * 64, 10), ("2" * 64, 5))
    assert (first.version, second.version, second.bytes, second.shards) == (1, 2, 15, 2)
    assert store.get_dataset_version("a", "ds").version == 2  # latest
    assert store.data_usage("a") == 15  # shards shared by versions count once
    spec = jobspec_from_mapping({"name": "j", "entrypoint": "t.py", "data": ["ds:1"]})
    job, _ = store.submit_job("a", spec, "alice")
    shown = store.get_dataset_version("a", "ds", 1)
    assert shown.used_by == (job.id,) and shown.manifest["shards"][0]["sha256"] == "1" * 64
    assert [v.ref for v in store.list_dataset_versions("a")] == ["ds:2", "ds:1"]


def test_another_tenant_finds_nothing(tenants: Store) -> None:
    _push(tenants, "a", "secret", ("3" * 64, 10))
    with pytest.raises(NotFound):
        tenants.get_dataset_version("b", "secret")
    with pytest.raises(NotFound):
        tenants.get_dataset_version("b", "secret", 1)
    with pytest.raises(NotFound):
        tenants.delete_dataset_version("b", "secret", 1, "mallory")
    assert tenants.list_dataset_versions("b") == [] and tenants.data_usage("b") == 0


def test_the_data_quota_refuses_a_version_and_names_it(tenants: Store) -> None:
    _push(tenants, "a", "ds", ("4" * 64, 60), quota=100)
    with pytest.raises(DataQuotaExceeded, match="data quota of 100 bytes"):
        _push(tenants, "a", "ds", ("5" * 64, 50), quota=100)
    tenants.set_data_policy("a", DataPolicy(quota_bytes=200), "admin")
    assert _push(tenants, "a", "ds", ("5" * 64, 50), quota=100)[0].version == 2


def test_delete_is_refused_while_an_unfinished_job_reads_it(tenants: Store) -> None:
    store = tenants
    _push(store, "a", "ds", ("6" * 64, 10))
    spec = jobspec_from_mapping({"name": "j", "entrypoint": "t.py", "data": ["ds:1"]})
    job, _ = store.submit_job("a", spec, "alice")
    with pytest.raises(Conflict, match=job.id):
        store.delete_dataset_version("a", "ds", 1, "alice")
    store.transition(job.id, JobState.CANCELLED, "alice")
    removed = store.delete_dataset_version("a", "ds", 1, "alice")
    assert removed.versions == ("ds:1",) and removed.shards == ("6" * 64,)
    with pytest.raises(NotFound):
        store.get_dataset_version("a", "ds", 1)


def test_retention_keeps_the_last_versions_and_days(tenants: Store, clock: ManualClock) -> None:
    store = tenants
    store.set_data_policy("a", DataPolicy(keep_versions=2), "admin")
    _push(store, "a", "ds", ("7" * 64, 1))
    _push(store, "a", "ds", ("8" * 64, 1))
    _, removed = _push(store, "a", "ds", ("8" * 64, 1), ("9" * 64, 1))
    assert removed.versions == ("ds:1",) and removed.shards == ("7" * 64,)
    store.set_data_policy("a", DataPolicy(keep_days=1.0), "admin")
    clock.advance(2 * DAY)
    _, removed = _push(store, "a", "ds", ("9" * 64, 1))
    assert removed.versions == ("ds:3", "ds:2") and removed.shards == ("8" * 64,)
    assert [v.version for v in store.list_dataset_versions("a", "ds")] == [4]


def test_a_queued_job_gets_its_own_tenants_input_shards(tenants: Store) -> None:
    """Data locality's view of a job: the shards of the versions it names, under its tenant's
    folder name only; another tenant's dataset of the same name gives it nothing."""
    from aicluster.control.loop.locality import with_input_shards

    store = tenants
    _push(store, "a", "ds", ("1" * 64, 10), ("2" * 64, 5))
    spec = jobspec_from_mapping({"name": "j", "entrypoint": "t.py", "data": ["ds:1"]})
    record, _ = store.submit_job("a", spec, "alice")
    job = with_input_shards(store, record, record.to_job())
    assert job.data == ((f"a/{'1' * 64}", 10), (f"a/{'2' * 64}", 5))
    intruder, _ = store.submit_job("b", spec, "mallory")
    assert with_input_shards(store, intruder, intruder.to_job()).data == ()
