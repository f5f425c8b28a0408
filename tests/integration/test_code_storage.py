"""The code store on the data store's one interface, on both backends: the local filesystem and
a real S3 server (SeaweedFS, started here: see s3server.py). Whatever ``datastore.json`` names,
uploads keep their checks (nothing stored past a cap, over the quota or unpackable), tenants
never read each other's archives, and a node unpacks shipped code from the store."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from s3server import backend_settings

from aicluster.artifacts import (
    CodeNotFound,
    CodeQuotaExceeded,
    CodeStore,
    CodeTooLarge,
    CodeTreeError,
    code_store,
    pack_tree,
)
from aicluster.artifacts.datasets import dataset_files
from aicluster.artifacts.storage import CONFIG_FILE, StorageSettings, data_storage
from aicluster.runtime.rundir import RunDir
from aicluster.runtime.workdir import CodeSource, node_cache, prepare_workdir

pytestmark = pytest.mark.integration

BIG = 10**9


@pytest.fixture(scope="module", params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> Iterator[StorageSettings | None]:
    with backend_settings(request.param) as settings:
        yield settings


@pytest.fixture
def state(backend: StorageSettings | None, tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A state directory of its own; on S3, a prefix of its own in the module's bucket."""
    state = tmp_path / "state"
    state.mkdir()
    if backend is not None:
        settings = replace(backend, prefix=request.node.name.replace("[", "-").strip("]"))
        (state / CONFIG_FILE).write_text(json.dumps(vars(settings)))
    return state


def _archive(folder: Path, body: str) -> bytes:
    folder.mkdir()
    (folder / "train.py").write_text(body)
    with pack_tree(folder) as packed:
        return packed.path.read_bytes()


def _objects(state: Path) -> list[str]:
    """Every object of the cluster's store: the S3 bucket's (under this test's prefix), or the
    files under the state directory's artifacts."""
    if (state / CONFIG_FILE).exists():
        return sorted(data_storage(state).list(""))
    root = state / "artifacts"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tar.gz"))


def _chunks(data: bytes, size: int = 100) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def test_stored_once_where_the_data_store_says(state: Path, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "code", "print('hi')\n")
    sha256 = hashlib.sha256(archive).hexdigest()
    store = code_store(state)
    first = store.put("a", _chunks(archive), max_bytes=BIG, tenant_quota_bytes=BIG)
    again = store.put("a", [archive], max_bytes=BIG, tenant_quota_bytes=BIG)
    assert (first.sha256, first.size, first.new, again.new) == (sha256, len(archive), True, False)
    assert store.has("a", sha256) and store.size("a", sha256) == store.usage("a") == len(archive)
    with store.open("a", sha256) as stored:
        assert stored.read() == archive
    on_s3 = (state / CONFIG_FILE).exists()
    assert _objects(state) == [f"_code/a/{sha256}.tar.gz" if on_s3 else f"code/a/{sha256}.tar.gz"]
    if on_s3:  # nothing of the code on the server's disk but its (empty) spool
        assert not (state / "artifacts" / "code").exists()


def test_what_is_refused_stores_nothing(state: Path, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "one", "x = 1\n")
    other = _archive(tmp_path / "two", "y = 2\n")
    store = code_store(state)
    with pytest.raises(CodeTooLarge):  # the cap, while streaming
        store.put("a", _chunks(archive), max_bytes=len(archive) - 1, tenant_quota_bytes=BIG)
    with pytest.raises(CodeTreeError):
        store.put("a", [b"\x1f\x8b junk"], max_bytes=BIG, tenant_quota_bytes=BIG)
    store.put("a", [archive], max_bytes=BIG, tenant_quota_bytes=BIG)
    with pytest.raises(CodeQuotaExceeded):  # a second archive would pass the tenant's total
        store.put("a", [other], max_bytes=BIG, tenant_quota_bytes=len(archive) + 10)
    assert _objects(state)[0].endswith(f"/a/{hashlib.sha256(archive).hexdigest()}.tar.gz")
    assert len(_objects(state)) == 1 and store.usage("a") == len(archive)
    assert not list((state / "artifacts" / "uploads").glob(".upload-*"))


def test_a_tenant_never_reads_another_tenants_code(state: Path, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "code", "secret = 1\n")
    store = code_store(state)
    sha256 = store.put("a-b", [archive], max_bytes=BIG, tenant_quota_bytes=BIG).sha256
    for other in ("a_b", "a.b", "A-b", "b"):  # confusable spellings share nothing
        assert not store.has(other, sha256) and store.usage(other) == 0
        with pytest.raises(CodeNotFound):
            store.open(other, sha256)
        with pytest.raises(CodeNotFound):
            store.size(other, sha256)
    # A tenant's datasets and code live beside each other in one store: neither is the other.
    dataset_files(state).put_shard("a-b", sha256, io.BytesIO(b"shard"))
    assert store.usage("a-b") == len(archive)
    with pytest.raises(ValueError):  # keys that would leave the tenant's prefix
        store.has("a-b", "../" + sha256[3:])


def test_async_upload_then_a_node_unpacks_it_from_the_store(state: Path, tmp_path: Path) -> None:
    archive = _archive(tmp_path / "code", "print('from the store')\n")
    store: CodeStore = code_store(state)

    async def body() -> AsyncIterator[bytes]:
        for chunk in _chunks(archive):
            yield chunk

    stored = asyncio.run(store.put_async("a", body(), max_bytes=BIG, tenant_quota_bytes=BIG))
    run = RunDir(state, "job-1", 0)
    work = prepare_workdir(run, "node-1", CodeSource("a", stored.sha256), owner=None)
    assert (work / "train.py").read_text() == "print('from the store')\n"
    assert (node_cache(state, "node-1") / "code" / "a" / stored.sha256 / "train.py").is_file()
    with pytest.raises(CodeNotFound):  # another tenant naming the same hash gets nothing
        prepare_workdir(RunDir(state, "job-2", 0), "node-1", CodeSource("b", stored.sha256), None)
