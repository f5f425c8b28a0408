"""Leader election: one control plane acts, any others stand by and take over when it stops.

Leadership is a lease: a row of the ``leases`` table (one per role, "control") naming its
holder, an **epoch** (+1 on every takeover) and a **renewal counter**.

PostgreSQL (several hosts): the leader renews the row every ``renew_s`` (3 s): one UPDATE that
bumps the counter, guarded by its holder id and epoch. A standby reads the row every poll (1 s)
and judges its age by **its own monotonic clock** from the last time it saw the row change, as
Kubernetes' leader election does, so the machines' clocks need not agree. Once it has seen no
change for ``lease_s`` (15 s) it takes over with one compare-and-set UPDATE (holder, epoch + 1,
counter reset) conditioned on the exact row it watched; of several standbys exactly one wins.
A row released by its holder (a clean shutdown: holder "") is taken at once. A frozen leader
(SIGSTOP, a long pause) or a vanished machine therefore loses leadership ``lease_s`` after its
last renewal, plus up to a second of polling; ``bench/failover.py`` measures it.

The leader stops acting on its own: :meth:`LeaderLease.still_leader` turns False once its
monotonic clock passes the start of its last successful renewal plus ``lease_s - margin_s``
(10 s), before any standby (which waits ``lease_s`` from a later moment) may take over. A
renewal that finds the row changed (a takeover) ends leadership at once.

Fencing (:mod:`aicluster.store.fencing`): the epoch won is a :class:`Fence`. The control loop
writes through ``store.fenced(lease.fence)``, whose every write transaction first checks the
row's epoch (share-locked until it commits) and raises
:class:`~aicluster.store.errors.LeaseLost` once another leader took over; a takeover waits for
the open ones. So a deposed leader that wakes up changes nothing, whatever its threads were
doing, and side effects outside the store (Ray launches, Serve deployments) check the epoch just
before they act. Its events carry its epoch (``events.epoch``), and each takeover logs a
``leader.elected`` event carrying the new one. PostgreSQL ends sessions idle inside a
transaction after 10 s (:data:`aicluster.store.engine.IDLE_IN_TRANSACTION_S`), so a leader
frozen in the middle of a transaction does not keep the row locked.

SQLite (one host): an exclusive ``flock`` on ``<state_dir>/leader-<name>.lock`` decides, as
before: the kernel releases it when the holder's process dies (not on NFS). The winner bumps the
lease row's epoch in the same way, and its writes are fenced alike; the lease does not expire (a
frozen holder keeps its lock), so nothing is renewed.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import IO, Any

from sqlalchemy import Connection, Row, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.fencing import Fence

__all__ = ["LEASE_S", "RENEW_S", "LeaderLease", "leader_lock"]

log = logging.getLogger(__name__)

#: Seconds without a renewal (as a standby sees it) after which the lease may be taken over.
LEASE_S = 15.0
#: Seconds between a leader's renewals.
RENEW_S = 3.0
#: The leader stops acting this long before a standby may take over (clock-rate slack).
MARGIN_S = 5.0
#: How long a lease statement may wait for a row lock or run (PostgreSQL), in milliseconds.
_STATEMENT_MS = 3000

#: SQLSTATEs of a lease statement that waited too long: lock_not_available, query_canceled.
_TIMED_OUT = ("55P03", "57014")

_leases = schema.leases


class LeaderLease:
    """An exclusive lease named ``name`` (one per role: "control", ...) over one store.

    ``holder`` identifies this contender (default: host, pid and a random suffix, so a restarted
    process is a new holder). ``monotonic`` is the clock leases are judged by (tests inject one).
    Thread-safe: :meth:`still_leader` never blocks; the other methods serialize.
    """

    def __init__(
        self,
        store: StoreBase,
        name: str = "control",
        *,
        holder: str | None = None,
        lease_s: float = LEASE_S,
        renew_s: float = RENEW_S,
        margin_s: float = MARGIN_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not name.replace("-", "").replace("_", "").isalnum() or len(name) > 63:
            raise ValueError(f"invalid lease name {name!r}")
        if not 0 < margin_s < lease_s or not 0 < renew_s < lease_s - margin_s:
            raise ValueError("need 0 < renew_s < lease_s - margin_s and margin_s > 0")
        if store.fence is not None:
            raise ValueError("a lease is taken through an unfenced store")
        if store.dialect != "postgresql" and store.state_dir is None:
            raise ValueError("leader election on SQLite needs a state directory (a file lock)")
        self.name = name
        host = socket.gethostname()[:200]
        self.holder = (holder or f"{host}/{os.getpid()}/{secrets.token_hex(3)}")[:255]
        self.lease_s, self.renew_s, self.margin_s = lease_s, renew_s, margin_s
        self._store = store
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._fence: Fence | None = None
        self._file: IO[str] | None = None
        self._valid_until = -math.inf  # our own monotonic deadline for acting as the leader
        self._renewed_at = -math.inf  # monotonic start of the last successful renewal
        self._seen: tuple[str, int, int] | None = None  # the row as a standby last saw it change
        self._seen_at = 0.0

    # -- state ------------------------------------------------------------------------------

    @property
    def held(self) -> bool:
        """Whether this lease was won and not given up or lost (see :meth:`still_leader`)."""
        fence = self._fence
        return fence is not None and not fence.revoked

    @property
    def fence(self) -> Fence | None:
        """The epoch won, for ``store.fenced(...)``; None while standing by."""
        return self._fence

    @property
    def epoch(self) -> int | None:
        return self._fence.epoch if self._fence is not None else None

    def still_leader(self) -> bool:
        """Whether to go on acting as the leader: the lease is held and, on PostgreSQL, was
        renewed recently enough by our own clock. Never blocks or touches the database; once it
        returns False the fence is revoked (fenced writes fail) and the lease must be released
        or acquired again."""
        fence = self._fence
        if fence is None or fence.revoked:
            return False
        if self._file is not None or self._monotonic() < self._valid_until:
            return True
        fence.revoke()
        log.warning("the %r lease was not renewed in time: no longer leading", self.name)
        return False

    # -- contending -------------------------------------------------------------------------

    def try_acquire(self) -> bool:
        """Take the lease if it is free or expired; never waits for it. True while held.

        On PostgreSQL a standby must call this regularly (every second or so): the lease's age
        is the time since this object last saw its row change.
        """
        with self._lock:
            if self.held:
                return True
            self._drop_local()
            if self._store.dialect == "postgresql":
                return self._try_row()
            return self._try_file()

    def acquire(self, timeout: float | None = None, poll: float = 0.5) -> bool:
        """Wait until the lease is ours (True) or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.try_acquire():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True

    def renew(self) -> bool:
        """Extend the lease now (PostgreSQL); returns :meth:`still_leader`. A renewal that finds
        another holder or epoch ends leadership; one that fails (database unreachable) leaves
        the deadline where it was."""
        with self._lock:
            fence = self._fence
            if fence is None or fence.revoked:
                return False
            if self._file is not None:
                return True
            started = self._monotonic()
            try:
                with self._transaction() as connection:
                    renewed = connection.execute(
                        update(_leases)
                        .where(
                            _leases.c.name == self.name,
                            _leases.c.holder == self.holder,
                            _leases.c.epoch == fence.epoch,
                        )
                        .values(renewals=_leases.c.renewals + 1, renewed_at=time.time())
                    ).rowcount
            except SQLAlchemyError as error:
                log.warning("cannot renew the %r lease: %s", self.name, _short(error))
                return self.still_leader()
            if renewed != 1:
                fence.revoke()
                log.warning("the %r lease was taken over: no longer leading", self.name)
                return False
            self._renewed_at = started
            self._valid_until = started + self.lease_s - self.margin_s
            return self.still_leader()

    def renew_if_due(self) -> bool:
        """:meth:`renew` once ``renew_s`` passed since the last one, else :meth:`still_leader`."""
        if self._monotonic() - self._renewed_at >= self.renew_s:
            return self.renew()
        return self.still_leader()

    def release(self) -> None:
        """Give the lease up (a standby then takes it at once). Idempotent; never raises for an
        unreachable database (the lease then expires)."""
        with self._lock:
            fence = self._fence
            if fence is not None:
                fence.revoke()
                try:
                    with self._transaction() as connection:
                        connection.execute(
                            update(_leases)
                            .where(
                                _leases.c.name == self.name,
                                _leases.c.holder == self.holder,
                                _leases.c.epoch == fence.epoch,
                            )
                            .values(holder="")
                        )
                except SQLAlchemyError as error:
                    log.warning("cannot release the %r lease: %s", self.name, _short(error))
            self._drop_local()

    # -- internals --------------------------------------------------------------------------

    def _drop_local(self) -> None:
        if self._fence is not None:
            self._fence.revoke()
            self._fence = None
        self._valid_until = self._renewed_at = -math.inf
        if self._file is not None:
            handle, self._file = self._file, None
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A write transaction of the (unfenced) store; on PostgreSQL bounded in time, so a
        lease statement never waits long for a row lock."""
        with self._store._write() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text(f"SET LOCAL lock_timeout = {_STATEMENT_MS}"))
                connection.execute(text(f"SET LOCAL statement_timeout = {_STATEMENT_MS}"))
            yield connection

    def _read_row(self) -> Row[Any] | None:
        with self._store._read() as connection:
            return connection.execute(select(_leases).where(_leases.c.name == self.name)).first()

    def _try_row(self) -> bool:
        """A standby's poll on PostgreSQL: note a change of the row, take it once expired."""
        row = self._read_row()
        now = self._monotonic()
        if row is not None:
            key = (str(row.holder), int(row.epoch), int(row.renewals))
            if key != self._seen:
                self._seen, self._seen_at = key, now
            free = row.holder in ("", self.holder)  # released, or ours from before
            if not free and now - self._seen_at < self.lease_s:
                return False
        return self._take(row, silent_s=None if row is None else now - self._seen_at)

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
        try:
            # The flock makes us the only contender: take the row whatever it says.
            if self._take(None, silent_s=None, force=True):
                return True
        except BaseException:
            self._drop_local()
            raise
        self._drop_local()
        return False

    def _take(self, row: Row[Any] | None, *, silent_s: float | None, force: bool = False) -> bool:
        """Compare-and-set the row to (us, epoch + 1) as it was read (``force``: as it is now);
        log ``leader.elected`` in the same transaction."""
        started = self._monotonic()
        now = time.time()
        values = {"holder": self.holder, "renewals": 0, "acquired_at": now, "renewed_at": now}
        try:
            with self._transaction() as connection:
                if force:
                    row = connection.execute(
                        select(_leases).where(_leases.c.name == self.name)
                    ).first()
                if row is None:
                    epoch = 1
                    connection.execute(_leases.insert().values(name=self.name, epoch=1, **values))
                else:
                    epoch = int(row.epoch) + 1
                    query = update(_leases).where(_leases.c.name == self.name)
                    if not force:
                        query = query.where(
                            _leases.c.holder == row.holder,
                            _leases.c.epoch == row.epoch,
                            _leases.c.renewals == row.renewals,
                        )
                    if connection.execute(query.values(epoch=epoch, **values)).rowcount != 1:
                        return False  # someone renewed or took it meanwhile
                fence = Fence(self.name, epoch)
                details = {
                    "lease": self.name,
                    "epoch": epoch,
                    "holder": self.holder,
                    "previous": None if row is None else row.holder,
                }
                if silent_s is not None:
                    details["silent_s"] = round(silent_s, 3)
                self._store.fenced(fence)._log(
                    connection, actor="leader-election", kind="leader.elected", details=details
                )
        except IntegrityError:  # another contender inserted the first row
            return False
        except OperationalError as error:
            if _sqlstate(error) not in _TIMED_OUT:
                raise
            # The row is locked by an open write of the old leader (a frozen one's, until the
            # server ends its idle session): try again at the next poll.
            log.info("the %r lease row is busy (%s); trying again", self.name, _short(error))
            return False
        self._fence = fence
        self._renewed_at = started
        self._valid_until = started + self.lease_s - self.margin_s
        self._seen = None
        log.info("took the %r lease: epoch %d (%s)", self.name, epoch, self.holder)
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


def _sqlstate(error: OperationalError) -> str | None:
    return getattr(error.orig, "sqlstate", None)


def _short(error: BaseException) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__


def leader_lock(
    store: StoreBase, name: str = "control", lease_s: float = LEASE_S, **options: Any
) -> LeaderLease:
    """A :class:`LeaderLease` over ``store`` (not yet acquired); ``options`` as its own. The
    renewal period and the safety margin scale with ``lease_s`` (a fifth and a third of it, as
    3 s and 5 s of 15 s) unless ``options`` give them."""
    options.setdefault("renew_s", lease_s * RENEW_S / LEASE_S)
    options.setdefault("margin_s", lease_s * MARGIN_S / LEASE_S)
    return LeaderLease(store, name, lease_s=lease_s, **options)
