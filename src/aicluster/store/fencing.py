"""Fencing: the leader's writes carry its lease epoch and are refused once the epoch moved on.

A :class:`Fence` is (lease name, epoch) as won by :class:`~aicluster.store.leader.LeaderLease`.
A store with a fence (``store.fenced(fence)``, the control loop's) checks it at the start of
every write transaction: it reads the lease row, share-locked until the transaction ends on
PostgreSQL (SQLite's ``BEGIN IMMEDIATE`` already excludes every other writer), and raises
:class:`~aicluster.store.errors.LeaseLost` unless the row still carries the fence's epoch. A
takeover updates that row, so it waits for the old leader's open write transactions and every
later one sees the new epoch: a deposed leader's write either committed before the takeover or
changes nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from sqlalchemy import Connection, select

from aicluster.store import schema
from aicluster.store.errors import LeaseLost

__all__ = ["Fence"]

_leases = schema.leases


@dataclass(eq=False)
class Fence:
    """The epoch a leader won; :meth:`revoke` (the lease was given up or lost) fails every later
    check without asking the database."""

    name: str
    epoch: int
    _revoked: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def revoked(self) -> bool:
        return self._revoked.is_set()

    def revoke(self) -> None:
        self._revoked.set()

    def check(self, connection: Connection, *, lock: bool = True) -> None:
        """Raise :class:`LeaseLost` unless the lease row still holds this epoch. With ``lock``
        (write transactions) the row stays share-locked until ``connection``'s transaction ends,
        so no takeover can commit in between."""
        if self.revoked:
            raise LeaseLost(f"the {self.name!r} lease of epoch {self.epoch} was given up")
        query = select(_leases.c.epoch).where(_leases.c.name == self.name)
        if lock and connection.dialect.name == "postgresql":
            query = query.with_for_update(read=True)  # FOR SHARE: a takeover's UPDATE waits
        epoch = connection.execute(query).scalar()
        if epoch != self.epoch:
            self.revoke()
            raise LeaseLost(
                f"the {self.name!r} lease moved to epoch {epoch} (this leader held {self.epoch})"
            )
