"""Datasets in the store: immutable versions per tenant, the versions jobs read, the tenant's
data quota and retention.

A version's shards live in the data store (:mod:`aicluster.artifacts.storage`); here is what
names them: the manifest and who pushed it when. Every method answers for one tenant only: a
name or version of another tenant is :class:`NotFound`, as one that does not exist. Methods that
remove versions return the shards no remaining version of the tenant names, for the caller to
delete from the data store once the transaction has committed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from aicluster.core import JobState
from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.errors import Conflict, NotFound

__all__ = ["DataPolicy", "DataQuotaExceeded", "DatasetOps", "DatasetVersionRecord", "Removed"]

versions = schema.dataset_versions
uses = schema.job_datasets
_DAY = 86_400.0
#: A job in one of these states still needs its datasets.
_ACTIVE = [s.value for s in JobState if not s.terminal]


class DataQuotaExceeded(Conflict):
    """Storing a version would take the tenant's shards past its data quota (413)."""

    def __init__(self, message: str, quota: int) -> None:
        super().__init__(message)
        self.quota = quota


@dataclass(frozen=True)
class DataPolicy:
    """A tenant's data quota in bytes (None: the server's default) and its retention: keep the
    last ``keep_versions`` of each dataset and those pushed in the last ``keep_days`` (None:
    no such rule; with both rules a version goes once either would drop it)."""

    quota_bytes: int | None = None
    keep_versions: int | None = None
    keep_days: float | None = None


@dataclass(frozen=True)
class DatasetVersionRecord:
    tenant: str
    name: str
    version: int
    manifest_sha256: str
    bytes: int
    files: int
    shards: int
    pushed_by: str
    pushed_at: float
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)
    used_by: tuple[str, ...] = ()  # jobs that read it (filled in by get_dataset_version)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class Removed:
    """Versions a call removed and the shards (SHA-256) no version of the tenant names now."""

    versions: tuple[str, ...]
    shards: tuple[str, ...]


class DatasetOps(StoreBase):
    def data_policy(self, tenant: str) -> DataPolicy:
        """Raises :class:`NotFound` for an unknown tenant."""
        t = schema.tenants
        query = select(t.c.data_quota_bytes, t.c.data_keep_versions, t.c.data_keep_days)
        with self._read() as connection:
            row = connection.execute(query.where(t.c.name == tenant)).first()
        if row is None:
            raise NotFound(f"no tenant {tenant!r}")
        return DataPolicy(row[0], row[1], row[2])

    def set_data_policy(self, tenant: str, policy: DataPolicy, actor: str) -> None:
        """Replace the tenant's data quota and retention. Raises :class:`NotFound`."""
        values = {
            "data_quota_bytes": policy.quota_bytes,
            "data_keep_versions": policy.keep_versions,
            "data_keep_days": policy.keep_days,
        }
        with self._write() as connection:
            t = schema.tenants
            if not connection.execute(update(t).where(t.c.name == tenant).values(values)).rowcount:
                raise NotFound(f"no tenant {tenant!r}")
            self._log(
                connection, actor=actor, kind="tenant.data_policy", tenant=tenant, details=values
            )

    def data_usage(self, tenant: str) -> int:
        """Bytes of the distinct shards the tenant's versions name."""
        with self._read() as connection:
            return sum(_shards(connection, tenant).values())

    def create_dataset_version(
        self,
        tenant: str,
        name: str,
        manifest: dict[str, Any],
        digest: str,
        actor: str,
        *,
        default_quota: int,
    ) -> tuple[DatasetVersionRecord, Removed]:
        """Store the next version of ``name`` (its manifest checked by the caller), then apply
        the tenant's retention. Raises :class:`DataQuotaExceeded` (nothing stored) and
        :class:`NotFound` for an unknown tenant."""
        policy = self.data_policy(tenant)
        quota = policy.quota_bytes if policy.quota_bytes is not None else default_quota
        try:
            with self._write() as connection:
                _check_quota(connection, tenant, manifest, quota)
                record = self._insert_dataset_version(
                    connection, tenant, name, manifest, digest, actor
                )
                removed = self._retain_datasets(connection, tenant, name, policy, actor)
        except IntegrityError:  # another push took the version number first
            raise Conflict(f"another push of {name} ran at the same time; push again") from None
        return record, removed

    def _insert_dataset_version(
        self,
        connection: Connection,
        tenant: str,
        name: str,
        manifest: dict[str, Any],
        digest: str,
        actor: str,
    ) -> DatasetVersionRecord:
        last = connection.execute(
            select(func.max(versions.c.version)).where(
                versions.c.tenant == tenant, versions.c.name == name
            )
        ).scalar()
        values = {
            "tenant": tenant,
            "name": name,
            "version": int(last or 0) + 1,
            "manifest_sha256": digest,
            "manifest": manifest,
            "bytes": sum(f["size"] for f in manifest["files"]),
            "files": len(manifest["files"]),
            "pushed_by": actor,
            "pushed_at": self._now(),
        }
        connection.execute(insert(versions).values(values))
        details = {k: values[k] for k in ("name", "version", "manifest_sha256", "bytes")}
        self._log(connection, actor=actor, kind="dataset.pushed", tenant=tenant, details=details)
        return _record(values)

    def _retain_datasets(
        self, connection: Connection, tenant: str, name: str, policy: DataPolicy, actor: str
    ) -> Removed:
        rows = connection.execute(
            select(versions.c.version, versions.c.pushed_at)
            .where(versions.c.tenant == tenant, versions.c.name == name)
            .order_by(versions.c.version.desc())
        ).all()
        now, drop = self._now(), []
        for index, (version, pushed_at) in enumerate(rows[1:], start=1):  # never the newest
            too_many = policy.keep_versions is not None and index >= policy.keep_versions
            too_old = policy.keep_days is not None and now - pushed_at > policy.keep_days * _DAY
            if (too_many or too_old) and not _jobs_needing(connection, tenant, name, version):
                drop.append(int(version))
        return self._remove_datasets(connection, tenant, name, drop, actor, "retention")

    def _remove_datasets(
        self,
        connection: Connection,
        tenant: str,
        name: str,
        drop: Iterable[int],
        actor: str,
        why: str,
    ) -> Removed:
        drop = list(drop)
        if not drop:
            return Removed((), ())
        before = set(_shards(connection, tenant))
        connection.execute(
            delete(versions).where(
                versions.c.tenant == tenant, versions.c.name == name, versions.c.version.in_(drop)
            )
        )
        for version in drop:
            details = {"name": name, "version": version, "why": why}
            self._log(
                connection, actor=actor, kind="dataset.deleted", tenant=tenant, details=details
            )
        orphans = tuple(sorted(before - set(_shards(connection, tenant))))
        return Removed(tuple(f"{name}:{v}" for v in drop), orphans)

    def delete_dataset_version(self, tenant: str, name: str, version: int, actor: str) -> Removed:
        """Remove one version. Raises :class:`NotFound`, and :class:`Conflict` naming the jobs
        while a job that is not finished reads it."""
        with self._write() as connection:
            self._dataset_row(connection, tenant, name, version)
            needing = _jobs_needing(connection, tenant, name, version)
            if needing:
                raise Conflict(
                    f"{name}:{version} is read by jobs that have not finished "
                    f"({', '.join(needing)}); delete it once they end"
                )
            return self._remove_datasets(connection, tenant, name, [version], actor, "deleted")

    def list_dataset_versions(
        self, tenant: str, name: str | None = None
    ) -> list[DatasetVersionRecord]:
        """The tenant's versions (newest first within a name), without manifests."""
        query = select(versions).where(versions.c.tenant == tenant)
        if name is not None:
            query = query.where(versions.c.name == name)
        query = query.order_by(versions.c.name, versions.c.version.desc())
        with self._read() as connection:
            rows = connection.execute(query).all()
        return [_record(row._mapping, manifest=False) for row in rows]

    def get_dataset_version(
        self, tenant: str, name: str, version: int | None = None
    ) -> DatasetVersionRecord:
        """One version (None: the newest) with its manifest and the jobs that read it."""
        with self._read() as connection:
            row = self._dataset_row(connection, tenant, name, version)
            jobs = connection.execute(
                select(uses.c.job_id)
                .where(uses.c.tenant == tenant, uses.c.name == name, uses.c.version == row.version)
                .order_by(uses.c.job_id)
            ).scalars()
            record = _record(row._mapping)
            return DatasetVersionRecord(**{**vars(record), "used_by": tuple(jobs)})

    def _dataset_row(
        self, connection: Connection, tenant: str, name: str, version: int | None
    ) -> Any:
        query = select(versions).where(versions.c.tenant == tenant, versions.c.name == name)
        if version is not None:
            query = query.where(versions.c.version == version)
        row = connection.execute(query.order_by(versions.c.version.desc()).limit(1)).first()
        if row is None:
            which = name if version is None else f"{name}:{version}"
            raise NotFound(f"tenant {tenant!r} has no dataset {which}")
        return row


def _check_quota(connection: Connection, tenant: str, manifest: dict[str, Any], quota: int) -> None:
    stored = _shards(connection, tenant)
    new = {s["sha256"]: s["size"] for s in manifest["shards"] if s["sha256"] not in stored}
    used, adding = sum(stored.values()), sum(new.values())
    if used + adding > quota:
        raise DataQuotaExceeded(
            f"tenant {tenant!r} stores {used} bytes of datasets; this version adds "
            f"{adding} bytes and would pass its data quota of {quota} bytes",
            quota,
        )


def _shards(connection: Connection, tenant: str) -> dict[str, int]:
    """The distinct shards (SHA-256 -> bytes) the tenant's versions name."""
    found: dict[str, int] = {}
    query = select(versions.c.manifest).where(versions.c.tenant == tenant)
    for (manifest,) in connection.execute(query):
        for shard in manifest["shards"]:
            found[shard["sha256"]] = int(shard["size"])
    return found


def _jobs_needing(connection: Connection, tenant: str, name: str, version: int) -> list[str]:
    query = (
        select(uses.c.job_id)
        .join(schema.jobs, schema.jobs.c.id == uses.c.job_id)
        .where(uses.c.tenant == tenant, uses.c.name == name, uses.c.version == version)
        .where(schema.jobs.c.state.in_(_ACTIVE))
        .order_by(uses.c.job_id)
    )
    return list(connection.execute(query).scalars())


def _record(row: Any, manifest: bool = True) -> DatasetVersionRecord:
    return DatasetVersionRecord(
        tenant=row["tenant"],
        name=row["name"],
        version=int(row["version"]),
        manifest_sha256=row["manifest_sha256"],
        bytes=int(row["bytes"]),
        files=int(row["files"]),
        shards=len(row["manifest"]["shards"]),
        pushed_by=row["pushed_by"],
        pushed_at=float(row["pushed_at"]),
        manifest=row["manifest"] if manifest else {},
    )
