"""Leader election: one control plane acts, any others stand by and take over when it dies.

PostgreSQL: the leader holds a session-level advisory lock (``pg_try_advisory_lock``) on a
connection of its own, outside the pool, kept open while it leads. The lock lives exactly as long
as that database session: if the leader process dies or its connection drops, PostgreSQL ends the
session and a standby's next try succeeds. TCP keepalives (about 25 s) bound how long a silent
network failure can keep a dead leader's session alive. The key hashes the database, the schema
and the lease name, so separate installations sharing a server do not contend.

SQLite: an exclusive ``flock`` on ``<state_dir>/leader-<name>.lock``. The kernel releases it when
the holder's process dies, so it is as safe as the PostgreSQL lock, but only between processes of
one host (and not on NFS): SQLite deployments are single-host by nature.

Leadership can be lost without notice (a dropped connection), so a leader calls
:meth:`LeaderLease.still_leader` at the start of every control-loop cycle and stops acting when it
returns False. Every write is a transaction and state changes are guarded by ``expected_from``, so
a deposed leader that finishes one last cycle cannot corrupt state, only repeat harmless work.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from types import TracebackType
from typing import IO

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from aicluster.store.base import StoreBase

__all__ = ["LeaderLease", "leader_lock"]

_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


class LeaderLease:
    """An exclusive lease named ``name`` (one per role: "control", ...) over one store."""

    def __init__(self, store: StoreBase, name: str = "control") -> None:
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"invalid lease name {name!r}")
        self.name = name
        self._store = store
        self._connection: Connection | None = None
        self._file: IO[str] | None = None
        if store.dialect != "postgresql" and store.state_dir is None:
            raise ValueError("leader election on SQLite needs a state directory (a file lock)")

    @property
    def held(self) -> bool:
        """Whether this lease was acquired and not released (see :meth:`still_leader`)."""
        return self._connection is not None or self._file is not None

    def try_acquire(self) -> bool:
        """Take the lease if it is free; never blocks. Idempotent (True while held)."""
        if self.held:
            return True
        if self._store.dialect == "postgresql":
            return self._try_postgres()
        return self._try_file()

    def acquire(self, timeout: float | None = None, poll: float = 0.5) -> bool:
        """Wait until the lease is ours (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_acquire():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True

    def still_leader(self) -> bool:
        """True while the lease is held; on PostgreSQL this proves the lock's session is alive.

        When it returns False the lease is released: stop acting, then try to acquire again.
        """
        if self._file is not None:
            return True  # a flock held by an open file cannot be lost
        if self._connection is None:
            return False
        try:
            self._connection.execute(text("SELECT 1"))
            return True
        except DBAPIError:
            self.release()
            return False

    def release(self) -> None:
        """Give the lease up. Idempotent."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            # Closing the session (NullPool: a real disconnect) drops the lock with it.
            try:
                connection.close()
            finally:
                connection.engine.dispose()
        if self._file is not None:
            handle, self._file = self._file, None
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    def _try_postgres(self) -> bool:
        engine = create_engine(self._store.engine.url, poolclass=NullPool, connect_args=_KEEPALIVES)
        connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        key = text(
            "SELECT pg_try_advisory_lock(hashtextextended("
            "'aicluster.leader/' || current_database() || '/' || current_schema() || '/' || :n, 0))"
        )
        try:
            won = bool(connection.execute(key, {"n": self.name}).scalar())
        except BaseException:
            connection.close()
            engine.dispose()
            raise
        if not won:
            connection.close()
            engine.dispose()
            return False
        self._connection = connection
        return True

    def _try_file(self) -> bool:
        assert self._store.state_dir is not None
        path = self._store.state_dir / f"leader-{self.name}.lock"
        handle = open(path, "a+")  # noqa: SIM115 - held open for as long as we lead
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        handle.seek(0)
        handle.truncate()
        handle.write(f"{socket.gethostname()} pid {os.getpid()}\n")
        handle.flush()
        self._file = handle
        return True

    def __enter__(self) -> LeaderLease:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def leader_lock(store: StoreBase, name: str = "control") -> LeaderLease:
    """A :class:`LeaderLease` over ``store`` (not yet acquired)."""
    return LeaderLease(store, name)
