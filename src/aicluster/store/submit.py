"""Job submission with group commit: concurrent submits share one transaction and one fsync.

A durable commit costs a disk flush; one flush per submission caps a SQLite store at a few hundred
submissions per second. On SQLite each caller queues its request and queues on the commit lock;
the caller that gets the lock commits every request queued by then in one transaction, each
inside its own SAVEPOINT, so one bad request (an idempotency conflict, an unknown tenant) rolls
back alone. Every caller returns only after the transaction holding its job has committed, and if
the commit fails, every caller in that batch gets the error: nothing unacknowledged is reported
as stored, and nothing acknowledged is lost. PostgreSQL runs concurrent transactions side by side
and groups their flushes itself (measured: batching there only serialized them), so there each
submission is its own transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.exc import IntegrityError

from aicluster.core import JobSpec, JobState
from aicluster.core.jobspec import SEALED_PREFIX
from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.errors import IdempotencyConflict, NotFound
from aicluster.store.jobs import job_record, job_record_from, new_job_id
from aicluster.store.records import JobRecord

__all__ = ["SecretsNotSealed", "SubmitOps"]

_MAX_KEY = 255
_MAX_BATCH = 256
jobs = schema.jobs
_BY_KEY = select(jobs).where(
    jobs.c.tenant == bindparam("tenant"), jobs.c.idempotency_key == bindparam("key")
)
_TENANT = select(schema.tenants.c.name).where(schema.tenants.c.name == bindparam("tenant"))
_INSERT = jobs.insert()


class SecretsNotSealed(ValueError):
    """A spec with ``secrets:`` reached a store that has no way to seal them."""


@dataclass(slots=True)
class _Request:
    tenant: str
    spec: JobSpec
    actor: str
    key: str | None
    service: Mapping[str, Any] | None = None
    result: tuple[JobRecord, bool] | None = None
    error: BaseException | None = None
    done: bool = False


class SubmitOps(StoreBase):
    #: Seals a spec's ``secrets:`` for a tenant before it is stored (the control plane sets it:
    #: ``aicluster.runtime.sandbox.secretbox.SecretBox.seal_spec``). Without it, a spec with
    #: secrets is refused: their plain values are never written.
    secret_sealer: Callable[[str, JobSpec], JobSpec] | None = None

    def _init_submit(self) -> None:
        self._queue: list[_Request] = []
        self._queue_lock = threading.Lock()
        self._commit_lock = threading.Lock()

    def submit_job(
        self,
        tenant: str,
        spec: JobSpec,
        actor: str,
        idempotency_key: str | None = None,
        *,
        service: Mapping[str, Any] | None = None,
    ) -> tuple[JobRecord, bool]:
        """Store a new PENDING job; returns ``(record, created)`` only after the commit.

        Idempotent per ``(tenant, idempotency_key)``: a retry with the same key and the same
        spec returns the original job with ``created=False``. Raises :class:`IdempotencyConflict`
        when the key was used for a different spec, :class:`NotFound` for an unknown tenant,
        :class:`~aicluster.core.JobSpecError` when the spec names another tenant, ``ValueError``
        for a key longer than 255 characters (:class:`SecretsNotSealed` for ``secrets:`` this
        store cannot seal; a sealer's own ``ValueError``), and any database error of the commit.

        ``service`` (``{"model", "version"}``) makes it a job of kind ``service``: a replica of
        that model deployment (only the serving leader submits those; the API never passes it).

        A spec's ``secrets:`` are sealed with :attr:`secret_sealer` first; the spec hash counts
        them by name only, so a retry whose secrets differ returns the original job.
        """
        if idempotency_key is not None and not 0 < len(idempotency_key) <= _MAX_KEY:
            raise ValueError(f"an idempotency key has 1 to {_MAX_KEY} characters")
        spec = _sealed(self.secret_sealer, tenant, spec.with_tenant(tenant))
        request = _Request(tenant, spec, actor, idempotency_key, dict(service) if service else None)
        if self._write_lock is None:
            # PostgreSQL: transactions run side by side on pooled connections and the server
            # already flushes concurrent commits together; batching would only serialize them.
            self._commit_batch([request])
        else:
            self._group_commit(request)
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _group_commit(self, request: _Request) -> None:
        with self._queue_lock:
            self._queue.append(request)
        while not request.done:
            with self._commit_lock:
                if request.done:  # an earlier lock holder committed it with its batch
                    break
                with self._queue_lock:
                    batch = self._queue[:_MAX_BATCH]
                    del self._queue[:_MAX_BATCH]
                self._commit_batch(batch)

    def _commit_batch(self, batch: list[_Request]) -> None:
        try:
            with self._write() as connection:
                for request in batch:
                    self._submit_in_savepoint(connection, request)
        except BaseException as error:  # the commit failed: nobody in the batch is acknowledged
            for request in batch:
                request.result, request.error = None, error
            if not isinstance(error, Exception):
                raise  # KeyboardInterrupt and friends stop the committer too
        finally:
            for request in batch:
                request.done = True

    def _submit_in_savepoint(self, connection: Connection, request: _Request) -> None:
        try:
            try:
                with connection.begin_nested():
                    request.result = self._submit_one(connection, request)
            except IntegrityError:
                # Another process inserted this key after our check (PostgreSQL; READ
                # COMMITTED lets this transaction see its committed row now).
                request.result = self._existing(connection, request)
                if request.result is None:
                    raise
        except (IdempotencyConflict, NotFound, IntegrityError) as error:
            request.error = error

    def _existing(self, connection: Connection, request: _Request) -> tuple[JobRecord, bool] | None:
        if request.key is None:
            return None
        row = connection.execute(_BY_KEY, {"tenant": request.tenant, "key": request.key}).first()
        if row is None:
            return None
        if row.spec_hash != request.spec.spec_hash:
            raise IdempotencyConflict(
                f"idempotency key {request.key!r} was used for a different spec (job {row.id})"
            )
        return job_record(row), False

    def _submit_one(self, connection: Connection, request: _Request) -> tuple[JobRecord, bool]:
        existing = self._existing(connection, request)
        if existing is not None:
            return existing
        if connection.execute(_TENANT, {"tenant": request.tenant}).first() is None:
            raise NotFound(f"no tenant {request.tenant!r}")
        spec, key, now = request.spec, request.key, self._now()
        job_id = new_job_id(now)
        values: dict[str, Any] = {
            "id": job_id,
            "tenant": request.tenant,
            "name": spec.name,
            "spec": spec.canonical_dict(reveal_secrets=True),  # sealed by submit_job
            "spec_hash": spec.spec_hash,
            "state": JobState.PENDING.value,
            "priority": spec.priority_value,
            "gpus": spec.workers * spec.resources.gpus,
            "submitted_by": request.actor,
            "submitted_at": now,
            "updated_at": now,
            "attempt": 0,
            "restarts": 0,
            "idempotency_key": key,
            "version": 1,
            "kind": "service" if request.service else "batch",
            "service": request.service,
        }
        connection.execute(_INSERT, values)
        _record_datasets(connection, job_id, request.tenant, spec)
        self._log(
            connection,
            actor=request.actor,
            kind="job.submitted",
            tenant=request.tenant,
            job_id=job_id,
            to_state=JobState.PENDING.value,
            details={"name": spec.name, "spec_hash": values["spec_hash"], "idempotency_key": key},
            at=now,
        )
        return job_record_from(values, spec), True


def _record_datasets(connection: Connection, job_id: str, tenant: str, spec: JobSpec) -> None:
    """The dataset versions the job reads (resolved by the API), for ``data rm`` and lineage."""
    rows = [
        {"job_id": job_id, "tenant": tenant, "name": name, "version": version}
        for name, version in spec.data_refs()
        if version is not None
    ]
    if rows:
        connection.execute(schema.job_datasets.insert(), rows)


def _sealed(
    sealer: Callable[[str, JobSpec], JobSpec] | None, tenant: str, spec: JobSpec
) -> JobSpec:
    """``spec`` with its secrets sealed; refuses to go on with a value that is not."""
    if not spec.secrets:
        return spec
    if sealer is None:
        raise SecretsNotSealed("this server cannot seal secrets: the job was not stored")
    sealed = sealer(tenant, spec)
    if not all(value.startswith(SEALED_PREFIX) for value in sealed.secret_values().values()):
        raise SecretsNotSealed("a secret was not sealed: the job was not stored")
    return sealed
