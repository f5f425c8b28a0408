"""Where dataset shards, manifests and shipped code are kept: one small interface, two backends.

:class:`BlobStorage` names objects by key (``a/b/c``: letters, digits, ``.``, ``_``, ``-``,
``=`` and ``~`` per part; never ``..``). :class:`LocalStorage` keeps them as files under a root
(the embedded default, ``<state_dir>/artifacts/datasets``); :class:`S3Storage` in a bucket of an
S3-compatible object store, through ``obstore`` (a maintained client: no signing of our own).

Which backend a cluster uses is ``<state_dir>/datastore.json`` (:func:`data_storage`): absent,
the local filesystem; ``{"kind": "s3", "bucket": ..., "endpoint": ..., ...}`` for S3. The API
server and every node read the same file, as they share the state directory for shipped code.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO, Protocol

__all__ = [
    "CONFIG_FILE",
    "BlobNotFound",
    "BlobStorage",
    "LocalStorage",
    "S3Storage",
    "StorageSettings",
    "data_storage",
    "storage_settings",
]

#: The data store's settings, in the state directory (absent: the local filesystem).
CONFIG_FILE = "datastore.json"
_PART = re.compile(r"^[A-Za-z0-9_=~-][A-Za-z0-9._=~-]{0,254}$")
_CHUNK = 1 << 20


class BlobNotFound(FileNotFoundError):
    """No object of that key."""


class BlobStorage(Protocol):
    """Objects by key. ``put`` replaces a whole object at once (readers never see half of
    one); ``open`` streams an object in chunks; ``list`` gives the keys under a prefix."""

    def put(self, key: str, source: BinaryIO) -> None: ...

    def open(self, key: str) -> Iterator[bytes]:
        """The object's bytes in chunks. Raises :class:`BlobNotFound`."""
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove the object; a missing one is no error."""
        ...

    def list(self, prefix: str) -> Iterator[str]: ...

    def size(self, key: str) -> int:
        """The object's size in bytes. Raises :class:`BlobNotFound`."""
        ...

    def usage(self, prefix: str) -> int:
        """Bytes of all objects under ``prefix`` (a tenant's quota)."""
        ...


def check_key(key: str) -> str:
    """``key`` if every part of it is a safe name, else ``ValueError``."""
    parts = key.split("/")
    if not all(_PART.fullmatch(part) and part not in (".", "..") for part in parts):
        raise ValueError(f"{key!r} is not a storage key")
    return key


class LocalStorage:
    """:class:`BlobStorage` as files under ``root`` (0600 files, 0700 folders)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def put(self, key: str, source: BinaryIO) -> None:
        final = self._path(key)
        final.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=final.parent, prefix=".put-", suffix=".part")
        try:
            with os.fdopen(descriptor, "wb") as out:
                while chunk := source.read(_CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(name, final)  # the whole object appears at once
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise

    def open(self, key: str) -> Iterator[bytes]:
        try:
            handle = self._path(key).open("rb")
        except FileNotFoundError:
            raise BlobNotFound(f"no object {key}") from None
        return _chunks(handle)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> Iterator[str]:
        folder = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not folder.is_dir():
            return
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.name.startswith(".put-"):
                yield path.relative_to(self.root).as_posix()

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(f"no object {key}") from None

    def usage(self, prefix: str) -> int:
        return sum(self._path(key).stat().st_size for key in self.list(prefix))


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


class S3Storage:
    """:class:`BlobStorage` in an S3 bucket (AWS, SeaweedFS, MinIO, ...) through ``obstore``;
    keys are stored under ``prefix``."""

    def __init__(self, settings: StorageSettings) -> None:
        from obstore.store import S3Store

        config: Any = {"region": settings.region or "us-east-1"}
        if settings.endpoint:
            config["endpoint"] = settings.endpoint
        if settings.access_key_id:
            config["access_key_id"] = settings.access_key_id
            config["secret_access_key"] = settings.secret_access_key
        client: Any = {"allow_http": True} if settings.allow_http else {}
        self._store = S3Store(settings.bucket, config=config, client_options=client)
        self._prefix = settings.prefix.strip("/")

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self._prefix}/{key}" if self._prefix else key

    def _under(self, prefix: str) -> str | None:
        """The listing prefix in the bucket; ``""`` lists all (as the local root does)."""
        if not prefix.strip("/"):
            return self._prefix or None
        return self._key(prefix.rstrip("/"))

    def put(self, key: str, source: BinaryIO) -> None:
        import obstore

        obstore.put(self._store, self._key(key), source)  # multipart for large objects

    def open(self, key: str) -> Iterator[bytes]:
        import obstore

        try:
            result = obstore.get(self._store, self._key(key))
        except FileNotFoundError:
            raise BlobNotFound(f"no object {key}") from None
        return (bytes(chunk) for chunk in result.stream(min_chunk_size=_CHUNK))

    def exists(self, key: str) -> bool:
        import obstore

        try:
            obstore.head(self._store, self._key(key))
        except FileNotFoundError:
            return False
        return True

    def delete(self, key: str) -> None:
        import obstore

        with contextlib.suppress(FileNotFoundError):
            obstore.delete(self._store, self._key(key))

    def list(self, prefix: str) -> Iterator[str]:
        import obstore

        strip = len(self._prefix) + 1 if self._prefix else 0
        for batch in obstore.list(self._store, self._under(prefix)):
            for meta in batch:
                yield str(meta["path"])[strip:]

    def size(self, key: str) -> int:
        import obstore

        try:
            return int(obstore.head(self._store, self._key(key))["size"])
        except FileNotFoundError:
            raise BlobNotFound(f"no object {key}") from None

    def usage(self, prefix: str) -> int:
        import obstore

        # One LIST gives every size: no HEAD per object.
        batches = obstore.list(self._store, self._under(prefix))
        return sum(int(meta["size"]) for batch in batches for meta in batch)


@dataclass(frozen=True)
class StorageSettings:
    """The data store: ``kind`` ``local`` (files under ``root``) or ``s3`` (``bucket`` at
    ``endpoint``; credentials here or in the usual ``AWS_*`` variables of the process)."""

    kind: str = "local"
    root: str | None = None
    bucket: str = ""
    endpoint: str | None = None
    region: str | None = None
    prefix: str = ""
    access_key_id: str | None = None
    secret_access_key: str | None = None
    allow_http: bool = False  # plain HTTP to the endpoint (a test server on 127.0.0.1)
    #: The bound of each node's shard cache (``aicluster.runtime.gang.datacache``): 20 GiB.
    node_cache_bytes: int = 20 << 30

    def __post_init__(self) -> None:
        if self.kind not in ("local", "s3"):
            raise ValueError(f"data store kind {self.kind!r}: expected 'local' or 's3'")
        if self.kind == "s3" and not self.bucket:
            raise ValueError("an s3 data store needs a bucket")

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> StorageSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{CONFIG_FILE}: unknown settings {', '.join(unknown)}")
        return cls(**data)

    def open(self, state_dir: Path) -> BlobStorage:
        if self.kind == "s3":
            return S3Storage(self)
        return LocalStorage(Path(self.root) if self.root else default_root(state_dir))


def default_root(state_dir: Path) -> Path:
    return Path(state_dir) / "artifacts" / "datasets"


def storage_settings(state_dir: str | os.PathLike[str]) -> StorageSettings:
    """``<state_dir>/datastore.json`` (see the module doc); the defaults without one."""
    path = Path(state_dir) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return StorageSettings()
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of settings")
    return StorageSettings.from_mapping(data)


def data_storage(state_dir: str | os.PathLike[str]) -> BlobStorage:
    """The cluster's data store as ``<state_dir>/datastore.json`` says (see the module doc)."""
    return storage_settings(state_dir).open(Path(state_dir))
