"""A tenant's dataset objects in the data store: shards and manifests, keyed by tenant.

Keys are ``<tenant>/shards/<sha256>`` and ``<tenant>/manifests/<sha256>.json`` (the tenant's
name encoded by :mod:`aicluster.core.names`, so no two tenants share a prefix): a tenant asking
for a hash finds only its own objects, even when another tenant stored the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from aicluster.artifacts.shards import DatasetError, canonical_json
from aicluster.artifacts.storage import BlobStorage, data_storage
from aicluster.core import names

__all__ = ["DatasetFiles", "dataset_files"]

_SHA = re.compile(r"^[0-9a-f]{64}$")


class DatasetFiles:
    """Shards and manifests per tenant over one :class:`BlobStorage`."""

    def __init__(self, storage: BlobStorage, spool: Path) -> None:
        self.storage = storage
        self._spool = spool

    def spool_dir(self) -> Path:
        """Where an upload is received before it is stored (the server's own disk)."""
        self._spool.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self._spool

    def shard_key(self, tenant: str, sha256: str) -> str:
        return f"{_prefix(tenant)}/shards/{_checked(sha256)}"

    def manifest_key(self, tenant: str, sha256: str) -> str:
        return f"{_prefix(tenant)}/manifests/{_checked(sha256)}.json"

    def has_shard(self, tenant: str, sha256: str) -> bool:
        return self.storage.exists(self.shard_key(tenant, sha256))

    def put_shard(self, tenant: str, sha256: str, source: BinaryIO) -> None:
        self.storage.put(self.shard_key(tenant, sha256), source)

    def open_shard(self, tenant: str, sha256: str) -> Iterator[bytes]:
        return self.storage.open(self.shard_key(tenant, sha256))

    def delete_shards(self, tenant: str, shards: Iterable[str]) -> None:
        for sha256 in shards:
            self.storage.delete(self.shard_key(tenant, sha256))

    def put_manifest(self, tenant: str, sha256: str, manifest: dict[str, Any]) -> None:
        self.storage.put(self.manifest_key(tenant, sha256), io.BytesIO(canonical_json(manifest)))

    def read_manifest(self, tenant: str, sha256: str) -> dict[str, Any]:
        """The manifest, its SHA-256 checked. Raises :class:`DatasetError` on a mismatch and
        :class:`~aicluster.artifacts.storage.BlobNotFound`."""
        data = b"".join(self.storage.open(self.manifest_key(tenant, sha256)))
        if hashlib.sha256(data).hexdigest() != sha256:
            raise DatasetError(f"manifest {sha256} does not match its SHA-256")
        manifest: dict[str, Any] = json.loads(data)
        return manifest


def dataset_files(state_dir: str | Path) -> DatasetFiles:
    """The cluster's dataset objects (``<state_dir>/datastore.json`` picks the backend)."""
    spool = Path(state_dir) / "artifacts" / "uploads"
    return DatasetFiles(data_storage(state_dir), spool)


def _prefix(tenant: str) -> str:
    return names.part(tenant)


def _checked(sha256: str) -> str:
    if not _SHA.fullmatch(sha256):
        raise ValueError(f"{sha256!r} is not a SHA-256 (64 lower-case hex digits)")
    return sha256
