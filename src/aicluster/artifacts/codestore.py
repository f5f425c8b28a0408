"""Where shipped code archives are kept, per tenant, named by their SHA-256.

:class:`CodeStore` is the interface the API and the nodes use; :class:`LocalCodeStore` keeps the
archives on the server's disk as ``<root>/<tenant>/<sha256>.tar.gz`` (files 0600, folders 0700;
the tenant's name encoded by :mod:`aicluster.core.names`, so no two tenants share a folder).
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
from collections.abc import AsyncIterable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from aicluster.artifacts.codetree import MAX_ARCHIVE_BYTES, check_archive
from aicluster.core import names
from aicluster.core.jobspec import CODE_HASH

__all__ = [
    "MAX_TENANT_BYTES",
    "MAX_UPLOAD_BYTES",
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
    """The server's code store: archives under ``<state_dir>/artifacts/code``."""
    return LocalCodeStore(Path(state_dir) / "artifacts" / "code")


class _Upload:
    """An archive being received into a temporary file (0600) of the tenant's folder."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        descriptor, name = tempfile.mkstemp(dir=folder, prefix=".upload-", suffix=".part")
        self.file, self.path = os.fdopen(descriptor, "wb"), Path(name)
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
        os.fsync(self.file.fileno())
        self.file.close()
        return self.digest.hexdigest()

    def discard(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


class LocalCodeStore:
    """:class:`CodeStore` on a local (or shared) filesystem under ``root``. Created lazily:
    constructing one touches no disk."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def put(
        self, tenant: str, chunks: Iterable[bytes], *, max_bytes: int, tenant_quota_bytes: int
    ) -> StoredCode:
        upload = _Upload(self._tenant_dir(tenant, create=True), max_bytes)
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
        upload = _Upload(self._tenant_dir(tenant, create=True), max_bytes)
        try:
            async for chunk in chunks:
                upload.write(chunk)
            # Reading the archive through and fsync block: off the event loop.
            return await asyncio.to_thread(self._commit, tenant, upload, tenant_quota_bytes)
        finally:
            upload.discard()

    def has(self, tenant: str, sha256: str) -> bool:
        return self._path(tenant, sha256).is_file()

    def size(self, tenant: str, sha256: str) -> int:
        try:
            return self._path(tenant, sha256).stat().st_size
        except FileNotFoundError:
            raise _not_found(tenant, sha256) from None

    def open(self, tenant: str, sha256: str) -> BinaryIO:
        try:
            return self._path(tenant, sha256).open("rb")
        except FileNotFoundError:
            raise _not_found(tenant, sha256) from None

    def usage(self, tenant: str) -> int:
        folder = self._tenant_dir(tenant)
        if not folder.is_dir():
            return 0
        return sum(path.stat().st_size for path in folder.glob(f"*{_SUFFIX}"))

    def _commit(self, tenant: str, upload: _Upload, quota: int) -> StoredCode:
        sha256 = upload.finish()
        final = self._path(tenant, sha256)
        if final.exists():
            return StoredCode(sha256, upload.size, new=False)
        check_archive(upload.path)
        with self._locked(tenant):  # usage and link together: concurrent uploads stay in quota
            if final.exists():
                return StoredCode(sha256, upload.size, new=False)
            used = self.usage(tenant)
            if used + upload.size > quota:
                raise CodeQuotaExceeded(
                    f"tenant {tenant!r} stores {used} bytes of code; this archive "
                    f"({upload.size} bytes) would pass its cap of {quota} bytes",
                    quota,
                )
            os.link(upload.path, final)  # the complete file appears at once, or not at all
        return StoredCode(sha256, upload.size, new=True)

    @contextmanager
    def _locked(self, tenant: str) -> Iterator[None]:
        descriptor = os.open(self._tenant_dir(tenant) / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def _tenant_dir(self, tenant: str, create: bool = False) -> Path:
        if len(tenant) > 63 or not _TENANT.fullmatch(tenant):
            raise ValueError(f"{tenant!r} is not a tenant name")
        folder = names.tenant_folder(self.root, tenant)  # injective: core/names.py
        if create:
            self.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            for path in (self.root, folder):
                path.mkdir(mode=0o700, exist_ok=True)
        return folder

    def _path(self, tenant: str, sha256: str) -> Path:
        if not _HASH.fullmatch(sha256):
            raise ValueError(f"{sha256!r} is not a SHA-256 (64 lower-case hex digits)")
        return self._tenant_dir(tenant) / f"{sha256}{_SUFFIX}"


def _not_found(tenant: str, sha256: str) -> CodeNotFound:
    return CodeNotFound(f"tenant {tenant!r} has no code {sha256}")
