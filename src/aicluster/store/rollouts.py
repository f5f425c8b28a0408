"""Canary rollouts as stored: one row per rollout, moved through its states by compare-and-set.

States: ``running`` → ``promoted`` | ``rolled_back`` | ``aborted``. While running,
``step_index`` is the step being held (``-1`` while the canary version's replicas start at 0%
traffic) and ``step_started_at`` when that step began, so a new leader resumes the step where
the old one was. Every change appends its event (``rollout.*``) in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, select, update

from aicluster.store import schema
from aicluster.store.base import StoreBase, _event
from aicluster.store.errors import Conflict, NotFound, StaleState
from aicluster.store.records import EventRecord

__all__ = ["ROLLOUT_STATES", "WARMING", "RolloutOps", "RolloutRecord"]

rollouts = schema.rollouts
ROLLOUT_STATES = ("running", "promoted", "rolled_back", "aborted")
_PAGE = 1000
#: ``step_index`` while the canary's replicas start (it serves 0% of traffic).
WARMING = -1
_OUTCOME_EVENTS = {
    "promoted": "rollout.promoted",
    "rolled_back": "rollout.rolled_back",
    "aborted": "rollout.aborted",
}


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """A rollout of ``to_version`` over ``from_version`` through ``steps`` (percent)."""

    id: int
    tenant: str
    name: str
    from_version: int
    to_version: int
    steps: tuple[int, ...]
    step_index: int
    interval_s: float
    max_error_rate: float
    max_p99_ms: float
    state: str
    reason: str | None
    step_started_at: float
    created_by: str
    created_at: float
    updated_at: float

    @property
    def weight(self) -> int:
        """The canary's share of traffic in percent at the current step (0 while warming)."""
        return self.steps[self.step_index] if self.step_index >= 0 else 0

    def traffic(self) -> dict[int, float]:
        """The traffic split this rollout wants now."""
        if self.state == "promoted":
            return {self.to_version: 100.0}
        if self.state != "running":
            return {self.from_version: 100.0}
        return {self.from_version: 100.0 - self.weight, self.to_version: float(self.weight)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "steps": list(self.steps),
            "step_index": self.step_index,
            "weight": self.weight,
            "interval_s": self.interval_s,
            "max_error_rate": self.max_error_rate,
            "max_p99_ms": self.max_p99_ms,
            "state": self.state,
            "reason": self.reason,
            "step_started_at": self.step_started_at,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


class RolloutOps(StoreBase):
    """Creating, reading and moving rollouts."""

    def create_rollout(
        self,
        tenant: str,
        name: str,
        *,
        from_version: int,
        to_version: int,
        steps: Sequence[int],
        interval_s: float,
        max_error_rate: float,
        max_p99_ms: float,
        actor: str,
    ) -> RolloutRecord:
        """Start a rollout (state ``running``, warming). Raises :class:`Conflict` when the
        deployment already has a running rollout."""
        now = self._now()
        with self._write() as connection:
            _lock_deployment(connection, tenant, name)
            if _running(connection, tenant, name) is not None:
                raise Conflict(f"model {name!r} already has a rollout in progress")
            values = {
                "tenant": tenant,
                "name": name,
                "from_version": from_version,
                "to_version": to_version,
                "steps": [int(s) for s in steps],
                "step_index": WARMING,
                "interval_s": float(interval_s),
                "max_error_rate": float(max_error_rate),
                "max_p99_ms": float(max_p99_ms),
                "state": "running",
                "reason": None,
                "step_started_at": now,
                "created_by": actor,
                "created_at": now,
                "updated_at": now,
            }
            result = connection.execute(rollouts.insert().returning(rollouts.c.id), values)
            record = _record({**values, "id": result.scalar_one()})
            self._log(
                connection,
                actor=actor,
                kind="rollout.started",
                tenant=tenant,
                to_state="running",
                details=_details(record, {}),
            )
        return record

    def get_rollout(self, tenant: str | None, rollout_id: int) -> RolloutRecord:
        """One rollout; raises :class:`NotFound` (also for another tenant's)."""
        query = select(rollouts).where(rollouts.c.id == rollout_id)
        with self._read() as connection:
            row = connection.execute(query).first()
        if row is None or (tenant is not None and row.tenant != tenant):
            raise NotFound(f"no rollout {rollout_id}")
        return _record(row._mapping)

    def current_rollout(self, tenant: str, name: str) -> RolloutRecord | None:
        """The running rollout of a deployment, or None."""
        with self._read() as connection:
            row = _running(connection, tenant, name)
        return None if row is None else _record(row._mapping)

    def list_rollouts(self, tenant: str, name: str, limit: int = 50) -> list[RolloutRecord]:
        """A deployment's rollouts, newest first."""
        query = (
            select(rollouts)
            .where(rollouts.c.tenant == tenant, rollouts.c.name == name)
            .order_by(rollouts.c.id.desc())
            .limit(max(1, min(limit, 1000)))
        )
        with self._read() as connection:
            return [_record(row._mapping) for row in connection.execute(query)]

    def running_rollouts(self) -> list[RolloutRecord]:
        """Every running rollout, oldest first (the controller's work list)."""
        query = select(rollouts).where(rollouts.c.state == "running").order_by(rollouts.c.id)
        with self._read() as connection:
            return [_record(row._mapping) for row in connection.execute(query)]

    def latest_rollouts(self) -> list[RolloutRecord]:
        """The newest rollout of every deployment that has one (a new leader's reconciliation)."""
        newest = select(rollouts.c.tenant, rollouts.c.name, rollouts.c.id).order_by(
            rollouts.c.id.desc()
        )
        seen: dict[tuple[str, str], int] = {}
        with self._read() as connection:
            for row in connection.execute(newest):
                seen.setdefault((row.tenant, row.name), row.id)
            ids = list(seen.values())
            query = select(rollouts).where(rollouts.c.id.in_(ids)).order_by(rollouts.c.id)
            return [_record(row._mapping) for row in connection.execute(query)] if ids else []

    def advance_rollout(
        self,
        record: RolloutRecord,
        step_index: int,
        *,
        actor: str,
        figures: Mapping[str, Any],
        reason: str,
    ) -> RolloutRecord:
        """Move a running rollout from ``record.step_index`` to ``step_index``; the step starts
        now. Raises :class:`StaleState` when someone moved it first (a manual promote)."""
        now = self._now()
        changes = {"step_index": step_index, "step_started_at": now, "updated_at": now}
        with self._write() as connection:
            new = self._move(connection, record, changes)
            self._log(
                connection,
                actor=actor,
                kind="rollout.step",
                tenant=record.tenant,
                from_state="running",
                to_state="running",
                details=_details(new, figures, reason=reason, previous_weight=record.weight),
            )
        return new

    def finish_rollout(
        self,
        record: RolloutRecord,
        state: str,
        *,
        actor: str,
        reason: str,
        figures: Mapping[str, Any] | None = None,
    ) -> RolloutRecord:
        """End a running rollout as ``promoted``, ``rolled_back`` or ``aborted``, with the
        reason and figures. Raises :class:`StaleState` when it is no longer at
        ``record.step_index`` or no longer running."""
        if state not in _OUTCOME_EVENTS:
            raise ValueError(f"not an outcome: {state!r}")
        now = self._now()
        changes = {"state": state, "reason": reason[:1024], "updated_at": now}
        with self._write() as connection:
            new = self._move(connection, record, changes)
            self._log(
                connection,
                actor=actor,
                kind=_OUTCOME_EVENTS[state],
                tenant=record.tenant,
                from_state="running",
                to_state=state,
                details=_details(new, figures or {}, reason=reason),
            )
        return new

    def _move(
        self, connection: Connection, record: RolloutRecord, changes: Mapping[str, Any]
    ) -> RolloutRecord:
        """Compare-and-set on (running, step_index): exactly one writer wins a step."""
        result = connection.execute(
            update(rollouts)
            .where(
                rollouts.c.id == record.id,
                rollouts.c.state == "running",
                rollouts.c.step_index == record.step_index,
            )
            .values(**changes)
        )
        if result.rowcount != 1:
            raise StaleState(f"rollout {record.id} moved on before this change")
        row = connection.execute(select(rollouts).where(rollouts.c.id == record.id)).one()
        return _record(row._mapping)

    def rollout_events(self, record: RolloutRecord, limit: int = 500) -> list[EventRecord]:
        """The events of one rollout, oldest first (the tenant's ``rollout.*`` events since it
        began, read page by page: other rollouts of the tenant may interleave)."""
        events = schema.events
        found: list[EventRecord] = []
        after = -1
        with self._read() as connection:
            while len(found) < limit:
                query = (
                    select(events)
                    .where(
                        events.c.tenant == record.tenant,
                        events.c.kind.like("rollout.%"),
                        events.c.at >= record.created_at,
                        events.c.id > after,
                    )
                    .order_by(events.c.id)
                    .limit(_PAGE)
                )
                page = [_event(row._mapping) for row in connection.execute(query)]
                found += [event for event in page if _belongs(event, record)]
                if len(page) < _PAGE or (found and found[-1].to_state not in (None, "running")):
                    break
                after = page[-1].id
        return found[:limit]


def _belongs(event: EventRecord, record: RolloutRecord) -> bool:
    return event.kind.startswith("rollout.") and event.details.get("rollout") == record.id


def _lock_deployment(connection: Connection, tenant: str, name: str) -> None:
    """Serialise rollout starts of one deployment on PostgreSQL (SQLite has one writer)."""
    deployments = schema.deployments
    connection.execute(
        select(deployments.c.id)
        .where(deployments.c.tenant == tenant, deployments.c.name == name)
        .with_for_update()
    ).first()


def _running(connection: Connection, tenant: str, name: str) -> Row[Any] | None:
    query = select(rollouts).where(
        rollouts.c.tenant == tenant, rollouts.c.name == name, rollouts.c.state == "running"
    )
    return connection.execute(query).first()


def _details(record: RolloutRecord, figures: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "rollout": record.id,
        "model": record.name,
        "from_version": record.from_version,
        "to_version": record.to_version,
        "step_index": record.step_index,
        "weight": record.weight,
        "traffic": {str(v): w for v, w in record.traffic().items()},
        **extra,
        "figures": dict(figures),
    }


def _record(row: Mapping[Any, Any]) -> RolloutRecord:
    return RolloutRecord(
        id=int(row["id"]),
        tenant=row["tenant"],
        name=row["name"],
        from_version=int(row["from_version"]),
        to_version=int(row["to_version"]),
        steps=tuple(int(s) for s in row["steps"]),
        step_index=int(row["step_index"]),
        interval_s=float(row["interval_s"]),
        max_error_rate=float(row["max_error_rate"]),
        max_p99_ms=float(row["max_p99_ms"]),
        state=row["state"],
        reason=row["reason"],
        step_started_at=float(row["step_started_at"]),
        created_by=row["created_by"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )
