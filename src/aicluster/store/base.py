"""What every part of the store shares: the engine, the clock, transactions and the event log."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from sqlalchemy import Connection, Engine, select

from aicluster.core import Clock
from aicluster.store import schema
from aicluster.store.engine import WRITE
from aicluster.store.fencing import Fence
from aicluster.store.records import EventRecord

__all__ = ["StoreBase", "WallClock"]

_INSERT_EVENT = schema.events.insert()


class WallClock:
    """Unix time: the live store stamps rows with the wall clock (tests inject a ManualClock)."""

    def now(self) -> float:
        return time.time()


class StoreBase:
    """Engine, clock and transaction helpers; the operations live in the mixins of ``Store``."""

    def __init__(self, engine: Engine, clock: Clock, state_dir: Path | None) -> None:
        self.engine = engine
        self.clock = clock
        self.state_dir = state_dir
        self._writer = engine.execution_options(**{WRITE: True})
        # SQLite has one writer at a time. Queueing this process's writers on a lock is fair
        # and prompt; left to SQLite's busy handler they poll with sleeps of up to 100 ms.
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else None
        self._fence: Fence | None = None

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @property
    def fence(self) -> Fence | None:
        """The leader epoch this store's writes are fenced by (None: not fenced)."""
        return self._fence

    def fenced(self, fence: Fence) -> Self:
        """This store (same engine, pool and locks) with every write transaction fenced by
        ``fence``: it first checks that the lease still carries the fence's epoch and raises
        :class:`~aicluster.store.errors.LeaseLost` otherwise (see :mod:`aicluster.store.fencing`).
        The control loop of a leader writes through it; the API's store stays unfenced."""
        view = copy.copy(self)
        view._fence = fence
        return view

    def check_fence(self) -> None:
        """Before a side effect outside the store (a Ray launch, a Serve deployment): raise
        :class:`~aicluster.store.errors.LeaseLost` unless the fence's epoch is still the
        lease's. A no-op on an unfenced store."""
        if self._fence is not None:
            with self._read() as connection:
                self._fence.check(connection, lock=False)

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction: commits when the block ends, rolls back if it raises. On a
        fenced store it first checks the fence, in the same transaction."""
        if self._write_lock is None:
            with self._writer.begin() as connection:
                if self._fence is not None:
                    self._fence.check(connection)
                yield connection
            return
        with self._write_lock, self._writer.begin() as connection:
            if self._fence is not None:
                self._fence.check(connection)
            yield connection

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """One read-only transaction (a consistent snapshot on both databases)."""
        with self.engine.connect() as connection:
            yield connection

    def _now(self) -> float:
        return self.clock.now()

    def _log(
        self,
        connection: Connection,
        *,
        actor: str,
        kind: str,
        tenant: str | None = None,
        job_id: str | None = None,
        from_state: str | None = None,
        to_state: str | None = None,
        details: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> None:
        """Append one event inside the caller's transaction: it commits with the change."""
        connection.execute(
            _INSERT_EVENT,
            {
                "at": self._now() if at is None else at,
                "actor": actor,
                "kind": kind,
                "tenant": tenant,
                "job_id": job_id,
                "from_state": from_state,
                "to_state": to_state,
                "details": dict(details or {}),
                "epoch": None if self._fence is None else self._fence.epoch,
            },
        )

    def _events(
        self,
        *,
        job_id: str | None = None,
        tenant: str | None = None,
        after_id: int | None = None,
        limit: int = 1000,
    ) -> list[EventRecord]:
        query = select(schema.events).order_by(schema.events.c.id).limit(limit)
        if job_id is not None:
            query = query.where(schema.events.c.job_id == job_id)
        if tenant is not None:
            query = query.where(schema.events.c.tenant == tenant)
        if after_id is not None:
            query = query.where(schema.events.c.id > after_id)
        with self._read() as connection:
            return [_event(row._mapping) for row in connection.execute(query)]


def _event(row: Mapping[Any, Any]) -> EventRecord:
    return EventRecord(
        id=row["id"],
        at=row["at"],
        actor=row["actor"],
        kind=row["kind"],
        tenant=row["tenant"],
        job_id=row["job_id"],
        from_state=row["from_state"],
        to_state=row["to_state"],
        details=row["details"] or {},
    )
