"""Where shipped code archives are kept, per tenant, named by their SHA-256.

:class:`CodeStore` is the interface the API and the nodes use; :class:`BlobCodeStore` keeps the
archives in the data store's :class:`~aicluster.artifacts.storage.BlobStorage`, so that with S3
configured (``<state_dir>/datastore.json``) shipped code lives in the object store too. Keys are
``<namespace>/<tenant>/<sha256>.tar.gz``, the tenant's name encoded by :mod:`aicluster.core.names`
(so no two tenants share a prefix). On the local filesystem (:class:`LocalCodeStore`, the
embedded default) that is ``<state_dir>/artifacts/code/<tenant>/<sha256>.tar.gz`` as before
(files 0600, folders 0700); in S3 the namespace is ``_code``, beside the datasets' ``<tenant>/``
keys: an encoded tenant never holds ``_``, so no tenant's dataset prefix is the code's.
Tenants share nothing: one tenant asking for another's hash finds nothing, even when both
uploaded the same tree.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import AsyncIterable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from aicluster.artifacts.codetree import MAX_ARCHIVE_BYTES, check_archive
from aicluster.artifacts.storage import BlobNotFound, BlobStorage, LocalStorage, storage_settings
from aicluster.core import names
from aicluster.core.jobspec import CODE_HASH

__all__ = [
    "MAX_TENANT_BYTES",
    "MAX_UPLOAD_BYTES",
    "BlobCodeStore",
    "CodeNotFound",
    "CodeQuotaExceeded",
    "CodeStore",
    "CodeTooLarge",
    "LocalCodeStore",
    "StoredCode",
    "code_store",
]

#: The server's default caps (``ServerSettings``): one upload (what ``aicluster submit`` packs at
#: most by default), and all of one tenant's archives together.
MAX_UPLOAD_BYTES = MAX_ARCHIVE_BYTES
MAX_TENANT_BYTES = 2 * 10**9

_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HASH = re.compile(CODE_HASH)
_SUFFIX = ".tar.gz"
#: The code's keys in a bucket shared with the datasets (see the module doc).
S3_NAMESPACE = "_code"
#: ``open`` keeps an archive this small in memory; a larger one spills to a temporary file.
_SPOOL_MEMORY_BYTES = 8 << 20


class CodeTooLarge(Exception):
    """An upload passed ``cap`` bytes; nothing was stored."""

    def __init__(self, message: str, cap: int) -> None:
        super().__init__(message)
        self.cap = cap


class CodeQuotaExceeded(CodeTooLarge):
    """Storing an upload would take the tenant's code past its total of ``cap`` bytes."""


class CodeNotFound(FileNotFoundError):
    """The tenant has no code of that hash (whether another tenant has is not said)."""


@dataclass(frozen=True)
class StoredCode:
    sha256: str
    size: int
    new: bool  # False: the tenant had stored this archive already


class CodeStore(Protocol):
    """Code archives per tenant. Tenant names follow JobSpec's (at most 63 characters of
    letters, digits, ``.``, ``_``, ``-``); hashes are lower-case hex SHA-256. Other names raise
    ``ValueError``."""

    def put(
        self, tenant: str, chunks: Iterable[bytes], *, max_bytes: int, tenant_quota_bytes: int
    ) -> StoredCode:
        """Store the archive made of ``chunks`` once per tenant and hash. Raises
        :class:`CodeTooLarge` as soon as it passes ``max_bytes``, :class:`CodeQuotaExceeded`
        when the tenant's archives would pass ``tenant_quota_bytes``, and
        :class:`~aicluster.artifacts.codetree.CodeTreeError` for an archive that would not
        unpack; then nothing is stored."""
        ...

    async def put_async(
        self,
        tenant: str,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int,
        tenant_quota_bytes: int,
    ) -> StoredCode:
        """:meth:`put` reading an async stream (an HTTP request's body)."""
        ...

    def has(self, tenant: str, sha256: str) -> bool: ...

    def size(self, tenant: str, sha256: str) -> int:
        """The archive's size in bytes. Raises :class:`CodeNotFound`."""
        ...

    def open(self, tenant: str, sha256: str) -> BinaryIO:
        """The archive, for reading. Raises :class:`CodeNotFound`."""
        ...

    def usage(self, tenant: str) -> int:
        """Bytes of the tenant's stored archives."""
        ...


def code_store(state_dir: Path) -> CodeStore:
    """The server's (and every node's) code store, on the data store that
    ``<state_dir>/datastore.json`` names: the local filesystem keeps the archives under
    ``<state_dir>/artifacts/code`` (where they always were), S3 under ``_code/`` in its bucket."""
    state = Path(state_dir)
    settings = storage_settings(state)
    spool = state / "artifacts" / "uploads"
    if settings.kind == "local":
        return LocalCodeStore(state / "artifacts" / "code", spool)
    return BlobCodeStore(settings.open(state), spool, namespace=S3_NAMESPACE)


class _Upload:
    """An archive being received into a temporary file (0600) of the spool folder."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(dir=folder, prefix=".upload-", suffix=".part")
        self.file, self.path = os.fdopen(descriptor, "w+b"), Path(name)
        self.digest, self.size, self.max_bytes = hashlib.sha256(), 0, max_bytes

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise CodeTooLarge(
                f"the code archive is larger than the upload cap of {self.max_bytes} bytes",
                self.max_bytes,
            )
        self.digest.update(chunk)
        self.file.write(chunk)

    def finish(self) -> str:
        self.file.flush()
        self.file.seek(0)
        return self.digest.hexdigest()

    def discard(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class BlobCodeStore:
    """:class:`CodeStore` on a :class:`BlobStorage`. An upload is received into ``spool`` (a
    folder of the server's own disk), hashed, checked, and only then put: the store never holds
    a part of an archive, nor one over a cap. Constructing one touches no disk."""

    def __init__(
        self,
        storage: BlobStorage,
        spool: Path,
        *,
        namespace: str = "",
        tenant_part: Callable[[str], str] = names.part,
    ) -> None:
        self.storage, self.spool = storage, Path(spool)
        self._namespace, self._tenant_part = namespace, tenant_part

    def put(
        self, tenant: str, chunks: Iterable[bytes], *, max_bytes: int, tenant_quota_bytes: int
    ) -> StoredCode:
        upload = self._receive(tenant, max_bytes)
        try:
            for chunk in chunks:
                upload.write(chunk)
            return self._commit(tenant, upload, tenant_quota_bytes)
        finally:
            upload.discard()

    async def put_async(
        self,
        tenant: str,
        chunks: AsyncIterable[bytes],
        *,
        max_bytes: int,
        tenant_quota_bytes: int,
    ) -> StoredCode:
        upload = self._receive(tenant, max_bytes)
        try:
            async for chunk in chunks:
                upload.write(chunk)
            # Reading the archive through and storing it block: off the event loop.
            return await asyncio.to_thread(self._commit, tenant, upload, tenant_quota_bytes)
        finally:
            upload.discard()

    def has(self, tenant: str, sha256: str) -> bool:
        return self.storage.exists(self._key(tenant, sha256))

    def size(self, tenant: str, sha256: str) -> int:
        try:
            return self.storage.size(self._key(tenant, sha256))
        except BlobNotFound:
            raise _not_found(tenant, sha256) from None

    def open(self, tenant: str, sha256: str) -> BinaryIO:
        # The protocol promises a file (callers read it with tarfile, which may seek), while a
        # blob is a stream of chunks (an S3 GET): spool it, in memory while small, else on disk.
        # Fetching it all here also makes a missing or broken object fail at open, not mid-read.
        try:
            chunks = self.storage.open(self._key(tenant, sha256))
        except BlobNotFound:
            raise _not_found(tenant, sha256) from None
        # The caller closes it (the protocol's contract), so no ``with`` here.
        spooled = tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY_BYTES)  # noqa: SIM115
        try:
            for chunk in chunks:
                spooled.write(chunk)
        except BaseException:
            spooled.close()
            raise
        spooled.seek(0)
        return spooled  # type: ignore[return-value]  # a BinaryIO in all but name

    def usage(self, tenant: str) -> int:
        return self.storage.usage(self._prefix(tenant) + "/")

    def _receive(self, tenant: str, max_bytes: int) -> _Upload:
        self._prefix(tenant)  # a bad tenant name is refused before anything is received
        return _Upload(self.spool, max_bytes)

    def _commit(self, tenant: str, upload: _Upload, quota: int) -> StoredCode:
        sha256 = upload.finish()
        key = self._key(tenant, sha256)
        if self.storage.exists(key):
            return StoredCode(sha256, upload.size, new=False)
        check_archive(upload.path)
        with self._locked(tenant):  # usage and put together: concurrent uploads stay in quota
            if self.storage.exists(key):
                return StoredCode(sha256, upload.size, new=False)
            used = self.usage(tenant)
            if used + upload.size > quota:
                raise CodeQuotaExceeded(
                    f"tenant {tenant!r} stores {used} bytes of code; this archive "
                    f"({upload.size} bytes) would pass its cap of {quota} bytes",
                    quota,
                )
            self.storage.put(key, upload.file)  # the whole object appears at once, or none
        return StoredCode(sha256, upload.size, new=True)

    @contextmanager
    def _locked(self, tenant: str) -> Iterator[None]:
        # A lock file in the spool: the API servers of a cluster share its state directory.
        lock = self.spool / f".code-{names.part(tenant)}.lock"
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def _prefix(self, tenant: str) -> str:
        if len(tenant) > 63 or not _TENANT.fullmatch(tenant):
            raise ValueError(f"{tenant!r} is not a tenant name")
        part = self._tenant_part(tenant)
        return f"{self._namespace}/{part}" if self._namespace else part

    def _key(self, tenant: str, sha256: str) -> str:
        if not _HASH.fullmatch(sha256):
            raise ValueError(f"{sha256!r} is not a SHA-256 (64 lower-case hex digits)")
        return f"{self._prefix(tenant)}/{sha256}{_SUFFIX}"


class LocalCodeStore(BlobCodeStore):
    """:class:`BlobCodeStore` as files ``<root>/<tenant>/<sha256>.tar.gz``; a tenant's folder
    made before names were encoded is kept (:func:`aicluster.core.names.tenant_folder`), so code
    stored before an upgrade is still found. ``spool`` defaults to ``<root>/.uploads``."""

    def __init__(self, root: Path, spool: Path | None = None) -> None:
        root = Path(root)
        super().__init__(
            LocalStorage(root),
            spool if spool is not None else root / ".uploads",
            tenant_part=lambda tenant: names.tenant_folder(root, tenant).name,
        )
        self.root = root


def _not_found(tenant: str, sha256: str) -> CodeNotFound:
    return CodeNotFound(f"tenant {tenant!r} has no code {sha256}")
