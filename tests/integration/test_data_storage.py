"""The data store's one interface on both backends: the local filesystem and a real S3 server
(SeaweedFS, started here: see s3server.py), with keys that cannot leave their tenant's prefix."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3server import s3_server

from aicluster.artifacts.datasets import DatasetFiles
from aicluster.artifacts.storage import BlobNotFound, BlobStorage, LocalStorage, check_key

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["local", "s3"])
def storage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BlobStorage]:
    if request.param == "local":
        yield LocalStorage(tmp_path_factory.mktemp("blobs"))
        return
    with s3_server() as settings:
        yield settings.open(tmp_path_factory.mktemp("unused"))


def test_put_open_exists_list_delete(storage: BlobStorage) -> None:
    body = os.urandom(3 * (1 << 20) + 17)  # several chunks
    storage.put("t/shards/x", io.BytesIO(body))
    storage.put("t/shards/y", io.BytesIO(b"small"))
    storage.put("u/shards/x", io.BytesIO(b"other tenant"))
    assert storage.exists("t/shards/x") and not storage.exists("t/shards/z")
    assert b"".join(storage.open("t/shards/x")) == body
    assert sorted(storage.list("t/shards")) == ["t/shards/x", "t/shards/y"]
    storage.put("t/shards/y", io.BytesIO(b"replaced"))
    assert b"".join(storage.open("t/shards/y")) == b"replaced"
    storage.delete("t/shards/y")
    storage.delete("t/shards/never")  # no error
    assert not storage.exists("t/shards/y")
    with pytest.raises(BlobNotFound):
        b"".join(storage.open("t/shards/y"))


@pytest.mark.parametrize("key", ["../x", "a/../b", "/abs", "a//b", "a/./b", "", "a/b\x00"])
def test_keys_that_could_escape_are_refused(storage: BlobStorage, key: str) -> None:
    with pytest.raises(ValueError):
        check_key(key)
    with pytest.raises(ValueError):
        storage.put(key, io.BytesIO(b"x"))


def test_tenants_never_share_a_prefix(storage: BlobStorage, tmp_path: Path) -> None:
    files = DatasetFiles(storage, tmp_path)
    sha = "a" * 64
    files.put_shard("alpha", sha, io.BytesIO(b"alpha's"))
    assert files.has_shard("alpha", sha)
    for other in ("beta", "Alpha", "alpha.", "~alpha"):
        assert not files.has_shard(other, sha)
    with pytest.raises(ValueError):
        files.has_shard("alpha", "../" + "a" * 61)
