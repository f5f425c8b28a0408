"""The node cache on a real local data store: concurrent ranks fetch each shard once, files come
back under their pushed names (whole-shard files hard-linked), a corrupt shard is named, and
least recently used shards leave once the cache passes its bound."""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aicluster.artifacts.datasets import DatasetFiles
from aicluster.artifacts.shards import manifest_hash, plan_folder, shard_chunks
from aicluster.artifacts.storage import LocalStorage
from aicluster.runtime.gang.datacache import CorruptData, DataInput, NodeDataCache

pytestmark = pytest.mark.integration

FILES = {"a.txt": b"a" * 100, "d/b.txt": b"b" * 50, "whole.bin": os.urandom(700), "z": b""}


def _push(files: DatasetFiles, folder: Path, content: dict[str, bytes], name: str) -> DataInput:
    for path, data in content.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    plan = plan_folder(folder, shard_bytes=1000)
    for index, shard in enumerate(plan.shards):
        files.put_shard("t", shard["sha256"], io.BytesIO(b"".join(shard_chunks(plan, index))))
    digest = manifest_hash(plan.manifest())
    files.put_manifest("t", digest, plan.manifest())
    return DataInput(name, 1, digest)


@pytest.fixture
def files(tmp_path: Path) -> DatasetFiles:
    return DatasetFiles(LocalStorage(tmp_path / "store"), tmp_path / "spool")


def test_concurrent_ranks_fetch_each_shard_once(files: DatasetFiles, tmp_path: Path) -> None:
    wanted = _push(files, tmp_path / "d", FILES, "corpus")
    cache = NodeDataCache(tmp_path / "node", files, max_bytes=1 << 20)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: cache.prepare("t", wanted), range(4)))
    views = {view for view, _ in results}
    assert len(views) == 1
    assert sum(stats.shards_fetched for _, stats in results) == 2  # a+b grouped; whole.bin
    view = views.pop()
    assert {
        p.relative_to(view).as_posix(): p.read_bytes() for p in view.rglob("*") if p.is_file()
    } == FILES
    cached = next(p for p in (tmp_path / "node" / "shards").rglob("*") if p.stat().st_size == 700)
    assert (view / "whole.bin").stat().st_ino == cached.stat().st_ino  # linked, not copied
    assert (view / "a.txt").stat().st_mode & 0o777 == 0o444


def test_a_corrupt_shard_is_named_with_its_dataset(files: DatasetFiles, tmp_path: Path) -> None:
    wanted = _push(files, tmp_path / "d", {"x": b"x" * 10}, "fragile")
    (shard,) = list(files.storage.list("t/shards"))
    files.storage.put(shard, io.BytesIO(b"y" * 10))
    cache = NodeDataCache(tmp_path / "node", files, max_bytes=1 << 20)
    with pytest.raises(CorruptData, match=rf"shard {shard.split('/')[-1]} of dataset fragile:1"):
        cache.prepare("t", wanted)
    assert not list((tmp_path / "node" / "shards").rglob("*[0-9a-f]"))  # nothing cached


def test_least_recently_used_shards_leave_past_the_bound(
    files: DatasetFiles, tmp_path: Path
) -> None:
    first = _push(files, tmp_path / "one", {"f": os.urandom(600)}, "one")
    second = _push(files, tmp_path / "two", {"f": os.urandom(600)}, "two")
    cache = NodeDataCache(tmp_path / "node", files, max_bytes=1000)
    view, _ = cache.prepare("t", first)
    cache.prepare("t", second)
    shards = [p for p in (tmp_path / "node" / "shards").rglob("*") if p.is_file()]
    assert len(shards) == 1  # the first's shard went
    assert (view / "f").stat().st_size == 600  # its directory still holds the file
