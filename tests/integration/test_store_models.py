"""The model registry in the store, on real SQLite and PostgreSQL: versions, lineage, files."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from aicluster.core import ManualClock, Tenant
from aicluster.store import ModelVersionRecord, NotFound, Store, StoreError

pytestmark = pytest.mark.integration
META = {"format": 1, "entrypoint": "m.py:load", "config": {"width": 4}, "metrics": {"loss": 1.5}}


@pytest.fixture
def registry(store_url: str, clock: ManualClock, tmp_path: Path) -> Iterator[Store]:
    """A store with two tenants whose files live in ``tmp_path/state`` (SQLite: next to it)."""
    opened = Store.open(store_url, clock=clock, state_dir=tmp_path / "state")
    opened.create_tenant(Tenant("team-a"), "admin")
    opened.create_tenant(Tenant("team-b"), "admin")
    try:
        yield opened
    finally:
        opened.close()


def artifact(path: Path, loss: float = 1.5) -> Path:
    (path / "code").mkdir(parents=True)
    (path / "code" / "m.py").write_text("def load(w, c):\n    return None\n")
    (path / "weights.safetensors").write_bytes(b"not really weights")
    (path / "model.json").write_text(json.dumps({**META, "metrics": {"loss": loss}}))
    return path


def register(store: Store, source: Path, tenant: str = "team-a", name: str = "gpt", **kw: object):  # type: ignore[no-untyped-def]
    lineage: dict[str, object] = {
        "job_id": "j-1",
        "spec_hash": "s" * 64,
        "code_version": "c" * 64,
        "dataset_hash": "d" * 64,
        "metrics": {"loss": 1.5},
        "registered_by": "alice",
    }
    lineage.update(kw)
    return store.register_model_version(tenant, name, source_dir=source, **lineage)  # type: ignore[arg-type]


def test_register_copies_read_only_and_records_lineage(
    registry: Store, tmp_path: Path, clock: ManualClock
) -> None:
    record = register(registry, artifact(tmp_path / "export"))
    assert isinstance(record, ModelVersionRecord)
    assert (record.ref, record.job_id, record.registered_by) == ("gpt:1", "j-1", "alice")
    assert record.registered_at == clock.now() and record.metrics == {"loss": 1.5}
    assert record.meta == META and record.dataset_hash == "d" * 64
    assert record.artifact_dir.is_absolute()
    assert record.artifact_dir.parent == registry.state_dir / "models" / "team-a" / "gpt"  # type: ignore[operator]
    copied = record.artifact_dir / "code" / "m.py"
    assert copied.read_text().startswith("def load")
    assert not os.access(copied, os.W_OK) or os.geteuid() == 0
    assert oct(copied.stat().st_mode & 0o777) == oct(0o444)
    assert registry.get_model_version("team-a", "gpt") == record
    assert registry.get_model_version("team-a", "gpt", 1) == record
    events = [e for e in registry.audit("team-a") if e.kind == "model.registered"]
    assert [(e.job_id, e.details["version"], e.actor) for e in events] == [("j-1", 1, "alice")]
    # the source may change or vanish afterwards: the registered copy is its own
    (tmp_path / "export" / "model.json").write_text("{}")
    assert json.loads((record.artifact_dir / "model.json").read_text()) == META


def test_versions_count_up_and_the_same_job_is_idempotent(registry: Store, tmp_path: Path) -> None:
    first = register(registry, artifact(tmp_path / "a"), job_id="j-1")
    again = register(registry, artifact(tmp_path / "b"), job_id="j-1")
    second = register(registry, artifact(tmp_path / "c", loss=0.9), job_id="j-2", metrics={})
    other = register(registry, artifact(tmp_path / "d"), name="mlp", job_id="j-3")
    assert again == first and second.version == 2 and other.version == 1
    assert [v.version for v in registry.list_model_versions("team-a", "gpt")] == [1, 2]
    assert registry.get_model_version("team-a", "gpt").version == 2
    assert [m.ref for m in registry.list_models("team-a")] == ["gpt:2", "mlp:1"]
    assert [m.ref for m in registry.list_models(None)] == ["gpt:2", "mlp:1"]
    assert registry.list_models("team-b") == []
    kinds = [e.kind for e in registry.audit("team-a")]
    assert kinds.count("model.registered") == 3  # the repeat registered nothing
    versions_dir = registry.state_dir / "models" / "team-a" / "gpt"  # type: ignore[operator]
    assert sorted(p.name for p in versions_dir.iterdir()) == ["1", "2"]  # no staging left


def test_another_tenant_sees_nothing(registry: Store, tmp_path: Path) -> None:
    register(registry, artifact(tmp_path / "a"))
    with pytest.raises(NotFound):
        registry.get_model_version("team-b", "gpt")
    with pytest.raises(NotFound):
        registry.list_model_versions("team-b", "gpt")
    with pytest.raises(NotFound):
        registry.get_model_version("team-a", "gpt", 2)
    b = register(registry, artifact(tmp_path / "b"), tenant="team-b")
    assert (
        b.version == 1
        and b.artifact_dir != registry.get_model_version("team-a", "gpt").artifact_dir
    )


def test_bad_input_is_refused_and_leaves_nothing(registry: Store, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid model name"):
        register(registry, artifact(tmp_path / "a"), name="../escape")
    with pytest.raises(ValueError, match="not a directory"):
        register(registry, tmp_path / "missing")
    linked = artifact(tmp_path / "linked")
    (linked / "secret").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="not a regular file"):
        register(registry, linked)
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ValueError, match=r"model\.json"):
        register(registry, bare)
    with pytest.raises(NotFound, match="no tenant"):
        register(registry, artifact(tmp_path / "b"), tenant="team-z")
    assert registry.list_models(None) == []
    models = registry.state_dir / "models"  # type: ignore[operator]
    leftovers = [p for p in models.rglob("*") if p.is_file()] if models.exists() else []
    assert leftovers == []


def test_concurrent_registrations_get_distinct_versions(registry: Store, tmp_path: Path) -> None:
    sources = [artifact(tmp_path / f"s{i}") for i in range(6)]
    results: list[int] = []
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results.append(register(registry, sources[i], job_id=f"j-{i}").version)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(results) == [1, 2, 3, 4, 5, 6]


def test_a_postgresql_store_needs_a_state_dir(store_url: str, tmp_path: Path) -> None:
    with Store.open(store_url) as store:
        store.create_tenant(Tenant("team-a"), "admin")
        if store.dialect == "sqlite":
            assert store.state_dir is not None  # next to its database
            return
        with pytest.raises(StoreError, match="needs a state directory"):
            register(store, artifact(tmp_path / "a"))


def test_the_control_loop_registers_a_good_export_and_notes_a_bad_one(
    registry: Store, tmp_path: Path
) -> None:
    from modelkit import job_export_dir, succeeded_job, write_export

    from aicluster.control.learning.registry import register_on_success

    runtime_dir = tmp_path / "runtime"
    good, bad, silent = (succeeded_job(registry, "team-a", name) for name in ("g", "b", "s"))
    write_export(job_export_dir(runtime_dir, good.id))
    write_export(job_export_dir(runtime_dir, bad.id))
    (job_export_dir(runtime_dir, bad.id) / "model.json").write_text('{"format": 1}')
    for job in (good, bad, silent, good):  # the repeat: a loop that restarted
        register_on_success(registry, runtime_dir, job, "control-loop")
    (version,) = registry.list_model_versions("team-a", "g")
    assert (version.job_id, version.spec_hash, version.registered_by) == (
        good.id,
        good.spec_hash,
        "alice",
    )
    assert version.metrics == {"loss": 0.5} and version.dataset_hash == "d" * 64
    assert [m.name for m in registry.list_models("team-a")] == ["g"]
    (failed,) = [e for e in registry.events(bad.id) if e.kind == "model.register_failed"]
    assert failed.details["model"] == "b" and "entrypoint" in failed.details["reason"]
    assert not [e for e in registry.events(silent.id) if e.kind.startswith("model.")]
