"""The local code store: once per tenant and hash, caps that store nothing, tenants apart."""

from __future__ import annotations

import asyncio
import hashlib
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from aicluster.artifacts import (
    CodeNotFound,
    CodeQuotaExceeded,
    CodeTooLarge,
    CodeTreeError,
    LocalCodeStore,
    code_store,
    pack_tree,
)

BIG = 10**9


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[bytes]:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    with pack_tree(tmp_path / "code") as packed:
        yield packed.path.read_bytes()


def _chunks(data: bytes, size: int = 100) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def _stored(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_stored_once_per_tenant_and_hash(tmp_path: Path, archive: bytes) -> None:
    store = code_store(tmp_path / "state")
    sha256 = hashlib.sha256(archive).hexdigest()
    first = store.put("a", _chunks(archive), max_bytes=BIG, tenant_quota_bytes=BIG)
    again = store.put("a", [archive], max_bytes=BIG, tenant_quota_bytes=BIG)
    assert (first.sha256, first.size, first.new) == (sha256, len(archive), True)
    assert (again.sha256, again.new) == (sha256, False)
    root = tmp_path / "state" / "artifacts" / "code"
    assert _stored(root) == [f"a/{sha256}.tar.gz"]  # one file for two uploads, nothing else
    assert not list((tmp_path / "state" / "artifacts" / "uploads").glob(".upload-*"))
    assert store.has("a", sha256) and store.usage("a") == len(archive)
    with store.open("a", sha256) as stored:
        assert stored.read() == archive
    path = root / "a" / f"{sha256}.tar.gz"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((root / "a").stat().st_mode) == 0o700


def test_another_tenant_finds_nothing(tmp_path: Path, archive: bytes) -> None:
    store = LocalCodeStore(tmp_path)
    sha256 = store.put("a", [archive], max_bytes=BIG, tenant_quota_bytes=BIG).sha256
    assert not store.has("b", sha256)
    with pytest.raises(CodeNotFound):
        store.open("b", sha256)
    assert store.usage("b") == 0


def test_over_the_cap_nothing_is_stored(tmp_path: Path, archive: bytes) -> None:
    store = LocalCodeStore(tmp_path)
    with pytest.raises(CodeTooLarge) as refused:
        store.put("a", _chunks(archive), max_bytes=len(archive) - 1, tenant_quota_bytes=BIG)
    assert refused.value.cap == len(archive) - 1
    store.put("a", [archive], max_bytes=BIG, tenant_quota_bytes=BIG)
    with pytest.raises(CodeQuotaExceeded):  # a second, different archive passes the total
        store.put("a", [_other(tmp_path)], max_bytes=BIG, tenant_quota_bytes=len(archive) + 10)
    assert [p.name for p in (tmp_path / "a").iterdir() if p.name.endswith(".gz")] == [
        f"{hashlib.sha256(archive).hexdigest()}.tar.gz"
    ]
    assert not list((tmp_path / ".uploads").glob(".upload-*"))


def _other(tmp_path: Path) -> bytes:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.py").write_text("x = 1\n")
    with pack_tree(tmp_path / "other") as packed:
        return packed.path.read_bytes()


def test_what_would_not_unpack_is_refused(tmp_path: Path) -> None:
    store = LocalCodeStore(tmp_path)
    with pytest.raises(CodeTreeError):
        store.put("a", [b"\x1f\x8b junk"], max_bytes=BIG, tenant_quota_bytes=BIG)
    assert store.usage("a") == 0 and not list((tmp_path / ".uploads").glob(".upload-*"))


def test_async_put_and_bad_names(tmp_path: Path, archive: bytes) -> None:
    store = LocalCodeStore(tmp_path)

    async def body() -> AsyncIterator[bytes]:
        for chunk in _chunks(archive):
            yield chunk

    stored = asyncio.run(store.put_async("a", body(), max_bytes=BIG, tenant_quota_bytes=BIG))
    assert stored.new and store.size("a", stored.sha256) == len(archive)
    for tenant in ("../a", ".", "a/b", "a\n", "x" * 64, ""):
        with pytest.raises(ValueError):
            store.has(tenant, stored.sha256)
    for sha256 in ("../" + "0" * 61, stored.sha256.upper(), stored.sha256 + "\n"):
        with pytest.raises(ValueError):
            store.has("a", sha256)
