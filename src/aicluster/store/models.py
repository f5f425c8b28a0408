"""The model registry: immutable model versions with their lineage, files under the state dir.

A version's files live in ``<state_dir>/models/<tenant>/<name>/<version>/`` (tenant and name
encoded by :mod:`aicluster.core.names`, so no two tenants' models share a directory), copied
there from a job's export and made read-only; the ``model_versions`` row keeps the path relative
to the state directory, so a state directory can move (and versions registered before the
encoding keep theirs). Versions count 1, 2, … per (tenant, name) and never
change or disappear. Registration copies first (outside any transaction: a copy may be large),
then in one transaction picks the next version, renames the copy into place, inserts the row and
logs ``model.registered``; if the transaction fails the directory is taken back.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Row, func, select
from sqlalchemy.exc import IntegrityError

from aicluster.core import names
from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.errors import Conflict, NotFound, StoreError
from aicluster.store.lineage import copy_job_datasets
from aicluster.store.records import ModelVersionRecord

__all__ = ["MODELS_DIR", "ModelOps", "check_model_name"]

#: The registry's directory inside the state directory.
MODELS_DIR = "models"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_RETRIES = 5
versions = schema.model_versions


def check_model_name(name: str) -> str:
    """``name`` if it is a valid model name (as job names: 1-63 of ``A-Za-z0-9._-``, starting
    alphanumeric), else ``ValueError``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"invalid model name {name!r}: 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


class ModelOps(StoreBase):
    """Registering and reading model versions (mixed into ``Store``)."""

    def register_model_version(
        self,
        tenant: str,
        name: str,
        *,
        source_dir: str | os.PathLike[str],
        job_id: str | None,
        spec_hash: str | None,
        code_version: str,
        dataset_hash: str | None,
        metrics: Mapping[str, float],
        registered_by: str,
        parent: str | None = None,
    ) -> ModelVersionRecord:
        """Copy the artifact at ``source_dir`` into the registry as the next version of ``name``.

        Idempotent per job: if ``job_id`` already registered a version of ``name``, that version
        is returned and nothing is copied. The caller validates the artifact first
        (:func:`aicluster.train.export.read_model_meta`); the store only needs its ``model.json``
        to be a JSON object. ``parent`` (``NAME:VERSION``) is the model it was trained from; the
        datasets ``job_id`` read are copied into its lineage (:mod:`aicluster.store.lineage`).
        Raises ``ValueError`` for a bad name, a missing or bad
        ``model.json``, or a symlink or special file in the artifact; :class:`NotFound` for an
        unknown tenant; :class:`StoreError` when the store has no state directory.
        """
        check_model_name(name)
        root = self._models_root()
        if job_id is not None:
            existing = self._version_of_job(tenant, name, job_id)
            if existing is not None:
                return existing
        directory = root / names.part(tenant) / names.part(name)  # injective: core/names.py
        staged = _stage_copy(Path(source_dir), directory)
        try:
            meta = _read_meta(staged)
            for attempt in range(_RETRIES):
                try:
                    return self._insert_version(
                        staged,
                        tenant=tenant,
                        name=name,
                        job_id=job_id,
                        spec_hash=spec_hash,
                        code_version=code_version,
                        dataset_hash=dataset_hash,
                        metrics={str(k): float(v) for k, v in metrics.items()},
                        registered_by=registered_by,
                        parent=parent,
                        meta=meta,
                    )
                except IntegrityError as error:  # another writer took the version number
                    if attempt == _RETRIES - 1:
                        raise Conflict(f"could not register {name}: {error.orig}") from None
            raise AssertionError("unreachable")
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone already when it was renamed

    def _insert_version(
        self, staged: Path, *, tenant: str, name: str, job_id: str | None, **row: Any
    ) -> ModelVersionRecord:
        final: Path | None = None
        try:
            with self._write() as connection:
                _lock_tenant(connection, tenant)
                if job_id is not None:
                    found = _find_job_version(connection, tenant, name, job_id)
                    if found is not None:
                        return self._record(found)
                version = _next_version(connection, tenant, name)
                final = staged.parent / str(version)
                if final.exists():  # left by a process that died between rename and commit
                    shutil.rmtree(final)
                os.rename(staged, final)
                values = {
                    **row,
                    "tenant": tenant,
                    "name": name,
                    "version": version,
                    "job_id": job_id,
                    "registered_at": self._now(),
                    "artifact": final.relative_to(self._models_root().parent).as_posix(),
                }
                connection.execute(versions.insert().values(values))
                if job_id is not None:
                    copy_job_datasets(connection, tenant, name, version, job_id)
                self._log(
                    connection,
                    actor=row["registered_by"],
                    kind="model.registered",
                    tenant=tenant,
                    job_id=job_id,
                    details={"model": name, "version": version, "metrics": row["metrics"]},
                    at=values["registered_at"],
                )
            return self._record(values)
        except BaseException:
            if final is not None and final.exists() and not staged.exists():
                os.rename(final, staged)  # back to the staging name: a retry uses it again
            raise

    def list_models(self, tenant: str | None) -> list[ModelVersionRecord]:
        """The latest version of each model of ``tenant`` (every tenant's with None), by tenant
        and name. A model's version number is also its number of versions."""
        latest = select(
            versions.c.tenant, versions.c.name, func.max(versions.c.version).label("v")
        ).group_by(versions.c.tenant, versions.c.name)
        if tenant is not None:
            latest = latest.where(versions.c.tenant == tenant)
        sub = latest.subquery()
        query = (
            select(versions)
            .join(
                sub,
                (versions.c.tenant == sub.c.tenant)
                & (versions.c.name == sub.c.name)
                & (versions.c.version == sub.c.v),
            )
            .order_by(versions.c.tenant, versions.c.name)
        )
        with self._read() as connection:
            return [self._record(dict(row._mapping)) for row in connection.execute(query)]

    def list_model_versions(self, tenant: str, name: str) -> list[ModelVersionRecord]:
        """Every version of a model, oldest first. Raises :class:`NotFound` if it has none."""
        query = (
            select(versions)
            .where(versions.c.tenant == tenant, versions.c.name == name)
            .order_by(versions.c.version)
        )
        with self._read() as connection:
            rows = connection.execute(query).all()
        if not rows:
            raise NotFound(f"no model {name!r}")
        return [self._record(dict(row._mapping)) for row in rows]

    def get_model_version(
        self, tenant: str, name: str, version: int | None = None
    ) -> ModelVersionRecord:
        """One version of a model (the latest with None). Raises :class:`NotFound` (also for
        another tenant's model)."""
        query = select(versions).where(versions.c.tenant == tenant, versions.c.name == name)
        query = query.order_by(versions.c.version.desc()).limit(1)
        if version is not None:
            query = query.where(versions.c.version == version)
        with self._read() as connection:
            row = connection.execute(query).first()
        if row is None:
            which = name if version is None else f"{name}:{version}"
            raise NotFound(f"no model {which!r}")
        return self._record(dict(row._mapping))

    def model_version_of_job(
        self, tenant: str, name: str, job_id: str
    ) -> ModelVersionRecord | None:
        """The version of ``name`` that ``job_id`` registered, if any."""
        return self._version_of_job(tenant, name, job_id)

    def _version_of_job(self, tenant: str, name: str, job_id: str) -> ModelVersionRecord | None:
        with self._read() as connection:
            row = _find_job_version(connection, tenant, name, job_id)
        return None if row is None else self._record(row)

    def _models_root(self) -> Path:
        if self.state_dir is None:
            raise StoreError(
                "the model registry needs a state directory: open the store with state_dir="
            )
        return self.state_dir / MODELS_DIR

    def _record(self, row: Mapping[str, Any]) -> ModelVersionRecord:
        root = self._models_root().parent
        return ModelVersionRecord(
            tenant=row["tenant"],
            name=row["name"],
            version=row["version"],
            artifact_dir=(root / row["artifact"]).resolve(),
            meta=row["meta"],
            code_version=row["code_version"],
            metrics=row["metrics"],
            registered_by=row["registered_by"],
            registered_at=row["registered_at"],
            job_id=row["job_id"],
            spec_hash=row["spec_hash"],
            dataset_hash=row["dataset_hash"],
            parent=row.get("parent"),
        )


def _lock_tenant(connection: Connection, tenant: str) -> None:
    """Serialize registrations per tenant (a PostgreSQL row lock; SQLite has one writer)."""
    query = select(schema.tenants.c.name).where(schema.tenants.c.name == tenant).with_for_update()
    if connection.execute(query).first() is None:
        raise NotFound(f"no tenant {tenant!r}")


def _find_job_version(
    connection: Connection, tenant: str, name: str, job_id: str
) -> Mapping[str, Any] | None:
    row: Row[Any] | None = connection.execute(
        select(versions)
        .where(versions.c.tenant == tenant, versions.c.name == name, versions.c.job_id == job_id)
        .limit(1)
    ).first()
    return None if row is None else dict(row._mapping)


def _next_version(connection: Connection, tenant: str, name: str) -> int:
    query = select(func.max(versions.c.version)).where(
        versions.c.tenant == tenant, versions.c.name == name
    )
    return int(connection.execute(query).scalar() or 0) + 1


def _stage_copy(source: Path, parent: Path) -> Path:
    """Copy ``source`` to a fresh hidden directory in ``parent``; files become read-only.

    Refuses symlinks and special files: a job could otherwise point its export at files it
    must not publish, and the copy would follow the link.
    """
    if not source.is_dir():
        raise ValueError(f"{source}: not a directory")
    parent.mkdir(parents=True, exist_ok=True)
    staged = parent / f".staging-{secrets.token_hex(6)}"
    try:
        try:
            shutil.copytree(source, staged, symlinks=True, copy_function=shutil.copyfile)
        except shutil.Error as error:  # e.g. a FIFO: copyfile refuses special files
            raise ValueError(f"{source}: cannot copy the artifact: {error}") from None
        for path in staged.rglob("*"):
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ValueError(f"{path.relative_to(staged)}: not a regular file or directory")
            if stat.S_ISREG(mode):
                path.chmod(0o444)  # immutable in practice; the directories stay removable
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return staged


def _read_meta(directory: Path) -> dict[str, Any]:
    try:
        meta = json.loads((directory / "model.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"model.json: missing or unreadable ({error})") from None
    if not isinstance(meta, dict):
        raise ValueError("model.json: expected a JSON object")
    return meta
