"""Job operations: submit (idempotent), read, list, move through the state machine, cancel.

Each public method is one transaction, and each state change appends its event in that same
transaction, so the log and the jobs table never disagree.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, bindparam, func, or_, select, update

from aicluster.core import (
    TERMINAL_STATES,
    JobSpec,
    JobState,
    PendingReason,
    Placement,
    check_transition,
)
from aicluster.store import schema
from aicluster.store.base import StoreBase, _event
from aicluster.store.errors import NotFound, StaleState
from aicluster.store.records import EventRecord, JobRecord, placement_to_json

__all__ = ["MAX_AUDIT_PAGE", "AuditQuery", "JobOps", "job_record", "job_record_from", "new_job_id"]

_ACTIVE = [state.value for state in JobState if state.holds_resources]
jobs = schema.jobs
events = schema.events


def new_job_id(now: float) -> str:
    """``j-`` + milliseconds (hex, so ids sort by submission time) + 32 random bits."""
    return f"j-{int(now * 1000):011x}{secrets.token_hex(4)}"


class JobOps(StoreBase):
    """Reading jobs and moving them through the state machine (submission: ``SubmitOps``)."""

    def get_job(self, tenant: str | None, job_id: str) -> JobRecord:
        """The job; ``tenant=None`` reads any tenant's job (operators, the control loop).

        Raises :class:`NotFound` when it does not exist or belongs to another tenant.
        """
        with self._read() as connection:
            return job_record(_find(connection, tenant, job_id))

    def list_jobs(
        self,
        tenant: str | None,
        *,
        state: JobState | Iterable[JobState] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[JobRecord], str | None]:
        """A page of jobs, newest first, and the cursor of the next page (None on the last).

        ``tenant=None`` lists every tenant's jobs; ``state`` keeps one state or several.
        ``cursor`` is the last id of the previous page.
        """
        limit = max(1, min(limit, 1000))
        query = select(jobs).order_by(jobs.c.id.desc()).limit(limit + 1)
        if tenant is not None:
            query = query.where(jobs.c.tenant == tenant)
        if state is not None:
            wanted = [state] if isinstance(state, str) else list(state)
            query = query.where(jobs.c.state.in_([JobState(s).value for s in wanted]))
        if cursor is not None:
            query = query.where(jobs.c.id < cursor)
        with self._read() as connection:
            rows = connection.execute(query).all()
        page = [job_record(row) for row in rows[:limit]]
        return page, (page[-1].id if len(rows) > limit else None)

    def pending_jobs(self) -> list[JobRecord]:
        """Every PENDING job, oldest first: the scheduler's queue after a restart."""
        return self._by_states([JobState.PENDING.value])

    def active_jobs(self) -> list[JobRecord]:
        """Jobs holding resources (STARTING, RUNNING, PREEMPTING, RESTARTING), oldest first:
        after a restart the control loop reconciles them with what is really running."""
        return self._by_states(_ACTIVE)

    def service_jobs(self) -> list[JobRecord]:
        """Every service job not ended (PENDING or holding resources), oldest first: what the
        serving leader counts against each deployment version's wanted replicas."""
        live = [state.value for state in JobState if not state.terminal]
        query = (
            select(jobs)
            .where(jobs.c.kind == "service", jobs.c.state.in_(live))
            .order_by(jobs.c.submitted_at, jobs.c.id)
        )
        with self._read() as connection:
            return [job_record(row) for row in connection.execute(query)]

    def newest_event_id(self) -> int:
        """The newest event id (0 for an empty log): a mark for :meth:`jobs_changed_since`."""
        with self._read() as connection:
            return int(connection.execute(select(func.max(schema.events.c.id))).scalar() or 0)

    def jobs_changed_since(self, event_id: int) -> tuple[int, list[JobRecord]]:
        """Jobs with an event after ``event_id``, oldest first, and the newest event id seen.

        Every job change appends an event in its own transaction, so this is a change feed.
        On SQLite ids are given in commit order; on PostgreSQL a transaction may commit after
        one with a higher id, so callers re-read a margin below their mark (see the loop).
        """
        events = schema.events
        with self._read() as connection:
            rows = connection.execute(
                select(events.c.id, events.c.job_id).where(events.c.id > event_id)
            ).all()
            newest = max((row.id for row in rows), default=event_id)
            ids = sorted({row.job_id for row in rows if row.job_id is not None})
            found: list[JobRecord] = []
            for start in range(0, len(ids), 500):
                query = select(jobs).where(jobs.c.id.in_(ids[start : start + 500]))
                found.extend(job_record(row) for row in connection.execute(query))
        found.sort(key=lambda record: (record.submitted_at, record.id))
        return newest, found

    def _by_states(self, states: list[str]) -> list[JobRecord]:
        query = (
            select(jobs).where(jobs.c.state.in_(states)).order_by(jobs.c.submitted_at, jobs.c.id)
        )
        with self._read() as connection:
            return [job_record(row) for row in connection.execute(query)]

    def transition(
        self,
        job_id: str,
        to_state: JobState,
        actor: str,
        *,
        expected_from: JobState | None = None,
        reason: str | None = None,
        details: Mapping[str, Any] | None = None,
        placement: Placement | None = None,
        exit_code: int | None = None,
        progress: Mapping[str, Any] | None = None,
        failure: Mapping[str, Any] | None = None,
    ) -> JobRecord:
        """Move a job to ``to_state`` and log it, in one transaction.

        Entering STARTING counts an attempt (and may record ``placement`` in the same
        transaction); entering RESTARTING counts a restart; the first RUNNING sets
        ``started_at``; a terminal state sets ``finished_at`` and the exit info (``reason``,
        ``exit_code``, ``failure``); going back to PENDING forgets the placement. ``progress``
        (what an interrupted run leaves the job: ``Progress.to_json``) is stored and logged with
        it. ``failure`` (a failed attempt's first failed rank: ``core.failure.Failure.to_json``)
        is logged with the transition and, on a terminal one, kept as the job's.

        Raises :class:`NotFound`; :class:`~aicluster.core.IllegalTransition` when the state
        machine forbids the move; :class:`StaleState` when ``expected_from`` is given and the job
        is elsewhere. With ``expected_from``, a job already in ``to_state`` is returned unchanged:
        a retry after an unanswered commit is a no-op.
        """
        with self._write() as connection:
            return self._transition_in(
                connection,
                job_id,
                JobState(to_state),
                actor,
                expected_from=expected_from,
                reason=reason,
                details=details,
                placement=placement,
                exit_code=exit_code,
                progress=progress,
                failure=failure,
            )

    def start_jobs(
        self, starts: Iterable[tuple[str, Placement, str]], actor: str
    ) -> dict[str, JobRecord | None]:
        """Move PENDING jobs to STARTING with their placements, all in one transaction (a cycle
        may admit thousands: one commit each took seconds). ``starts`` holds (job id, placement,
        reason). Maps each id to its record, or to None when the job had left PENDING (e.g.
        cancelled meanwhile). Idempotent like :meth:`transition` with ``expected_from``."""
        started: dict[str, JobRecord | None] = {}
        with self._write() as connection:
            for job_id, placement, reason in starts:
                try:
                    started[job_id] = self._transition_in(
                        connection,
                        job_id,
                        JobState.STARTING,
                        actor,
                        expected_from=JobState.PENDING,
                        reason=reason,
                        placement=placement,
                    )
                except (StaleState, NotFound):
                    started[job_id] = None
        return started

    def _transition_in(
        self,
        connection: Connection,
        job_id: str,
        to_state: JobState,
        actor: str,
        *,
        expected_from: JobState | None = None,
        reason: str | None = None,
        details: Mapping[str, Any] | None = None,
        placement: Placement | None = None,
        exit_code: int | None = None,
        progress: Mapping[str, Any] | None = None,
        failure: Mapping[str, Any] | None = None,
    ) -> JobRecord:
        row = _find(connection, None, job_id, lock=True)
        current = JobState(row.state)
        if expected_from is not None and current != expected_from:
            if current == to_state:
                return job_record(row)
            wanted = JobState(expected_from).value
            raise StaleState(f"job {job_id} is {current.value}, not {wanted}")
        check_transition(current, to_state)
        now = self._now()
        values = _transition_values(row, to_state, now, reason, exit_code, failure)
        if placement is not None:
            values["placement"] = placement_to_json(placement)
        if progress is not None:
            values["progress"] = dict(progress)
        _update(connection, row, values)
        event = dict(details or {})
        if reason is not None:
            event["reason"] = reason
        if exit_code is not None:
            event["exit_code"] = exit_code
        if placement is not None:
            event["placement"] = placement.explain()
        if progress is not None:
            event["progress"] = dict(progress)
        if failure is not None:
            event["failure"] = dict(failure)
        self._log(
            connection,
            actor=actor,
            kind="job.transition",
            tenant=row.tenant,
            job_id=job_id,
            from_state=current.value,
            to_state=to_state.value,
            details=event,
            at=now,
        )
        return job_record(row, values)

    def record_placement(
        self, job_id: str, placement: Placement | Mapping[str, Any], actor: str
    ) -> JobRecord:
        """Store where a job's workers are (core Placement or JSON data) and log it.

        Raises :class:`NotFound`, and :class:`StaleState` unless the job holds resources.
        """
        data = placement_to_json(placement) if isinstance(placement, Placement) else placement
        with self._write() as connection:
            row = _find(connection, None, job_id, lock=True)
            if not JobState(row.state).holds_resources:
                raise StaleState(f"job {job_id} is {row.state}: it holds no placement")
            values = {"placement": dict(data), "updated_at": self._now()}
            _update(connection, row, values)
            self._log(
                connection,
                actor=actor,
                kind="job.placed",
                tenant=row.tenant,
                job_id=job_id,
                details={"placement": dict(data)},
            )
            return job_record(row, values)

    def set_pending_reason(self, job_id: str, reason: PendingReason | str | None) -> bool:
        """Record why a PENDING job waits; see :meth:`set_pending_reasons`."""
        return bool(self.set_pending_reasons({job_id: reason}))

    def set_pending_reasons(self, reasons: Mapping[str, PendingReason | str | None]) -> int:
        """Record, in one transaction, why each PENDING job waits (a Plan's ``pending``).

        Idempotent: unchanged reasons and jobs no longer PENDING are skipped, and no event is
        logged (reasons change every cycle; the log keeps state changes). Returns rows updated.
        """
        wanted = [
            {"_id": job_id, "_code": code, "_message": message}
            for job_id, (code, message) in (
                (job_id, _reason(value)) for job_id, value in reasons.items()
            )
        ]
        if not wanted:
            return 0
        # One UPDATE executed for many rows (executemany): a cycle may change thousands of
        # reasons, and a statement per row cost seconds.
        statement = (
            update(jobs)
            .where(
                jobs.c.id == bindparam("_id"),
                jobs.c.state == JobState.PENDING.value,
                or_(
                    jobs.c.pending_code.is_distinct_from(bindparam("_code")),
                    jobs.c.pending_reason.is_distinct_from(bindparam("_message")),
                ),
            )
            .values(pending_code=bindparam("_code"), pending_reason=bindparam("_message"))
        )
        with self._write() as connection:
            result = connection.execute(statement, wanted)
        return max(0, result.rowcount)

    def cancel_job(
        self, tenant: str | None, job_id: str, actor: str, reason: str | None = None
    ) -> JobRecord:
        """Cancel a job. A PENDING job becomes CANCELLED at once; a job holding resources is
        marked ``cancel_requested_at`` and the control loop stops it, then moves it to CANCELLED.

        Idempotent: cancelling a cancelled or already-requested job changes nothing (a requested
        job that went back to PENDING is cancelled at once). The control loop must not admit a
        PENDING job whose ``cancel_requested_at`` is set. Raises
        :class:`NotFound` (also for another tenant's job) and
        :class:`~aicluster.core.IllegalTransition` for a job that succeeded or failed.
        """
        with self._write() as connection:
            row = _find(connection, tenant, job_id, lock=True)
            state = JobState(row.state)
            requested = row.cancel_requested_at is not None and state.holds_resources
            if state is JobState.CANCELLED or requested:
                return job_record(row)
            now = self._now()
            details = {"reason": reason} if reason else {}
            if state is JobState.PENDING:
                values = _transition_values(row, JobState.CANCELLED, now, reason, None)
                kind, to_state = "job.transition", JobState.CANCELLED.value
            else:
                check_transition(state, JobState.CANCELLED)
                values = {"cancel_requested_at": now, "updated_at": now}
                kind, to_state = "job.cancel_requested", None
            _update(connection, row, values)
            self._log(
                connection,
                actor=actor,
                kind=kind,
                tenant=row.tenant,
                job_id=job_id,
                from_state=state.value if to_state else None,
                to_state=to_state,
                details=details,
                at=now,
            )
            return job_record(row, values)

    def record_event(
        self, job_id: str, kind: str, actor: str, details: Mapping[str, Any] | None = None
    ) -> None:
        """Append an observation about a job (a straggler, a hang, goodput) to the event log.

        Raises :class:`NotFound`.
        """
        with self._write() as connection:
            row = _find(connection, None, job_id)
            self._log(
                connection,
                actor=actor,
                kind=kind,
                tenant=row.tenant,
                job_id=job_id,
                details=details,
            )

    def events(self, job_id: str, tenant: str | None = None) -> list[EventRecord]:
        """A job's events, oldest first. Raises :class:`NotFound` (also for another tenant's)."""
        self.get_job(tenant, job_id)
        return self._events(job_id=job_id)

    def straggler_events(self, job_ids: Sequence[str]) -> dict[str, list[EventRecord]]:
        """Per job, oldest first, its ``job.straggler`` events and its moves to STARTING (what
        :func:`aicluster.api.explain.straggler_note` reads), in one query for a whole listing.
        Jobs without such events are left out."""
        found: dict[str, list[EventRecord]] = {}
        if not job_ids:
            return found
        query = (
            select(events)
            .where(
                events.c.job_id.in_(list(job_ids)),
                or_(events.c.kind == "job.straggler", events.c.to_state == JobState.STARTING.value),
            )
            .order_by(events.c.id)
        )
        with self._read() as connection:
            for row in connection.execute(query):
                found.setdefault(row.job_id, []).append(_event(row._mapping))
        return found

    def audit(
        self, tenant: str | None = None, *, after_id: int | None = None, limit: int = 1000
    ) -> list[EventRecord]:
        """The event and audit log, oldest first, from ``after_id`` on; one tenant's or all."""
        return self._events(tenant=tenant, after_id=after_id, limit=limit)

    def audit_page(
        self,
        tenants: Sequence[str] | None,
        query: AuditQuery,
    ) -> tuple[list[EventRecord], int | None]:
        """One page of the log that ``query`` selects, and the cursor of the next (None on the
        last). ``tenants=None`` reads every event, cluster-wide ones included; otherwise only
        events of those tenants (an empty list reads nothing)."""
        if tenants is not None and not tenants:
            return [], None
        limit = max(1, min(query.limit, MAX_AUDIT_PAGE))
        ordering = events.c.id.desc() if query.newest_first else events.c.id.asc()
        statement = select(events).where(*_audit_filters(tenants, query))
        with self._read() as connection:
            rows = connection.execute(statement.order_by(ordering).limit(limit + 1)).all()
        page = [_event(row._mapping) for row in rows[:limit]]
        return page, (page[-1].id if len(rows) > limit else None)

    def record_api_calls(
        self, calls: Iterable[tuple[str, str, str | None, Mapping[str, Any]]]
    ) -> None:
        """Append the audit records of API calls that changed state, (kind, actor, tenant,
        details) each, in one transaction (see :mod:`aicluster.api.auditlog`)."""
        with self._write() as connection:
            for kind, actor, tenant, details in calls:
                self._log(connection, actor=actor, kind=kind, tenant=tenant, details=details)


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """What an audit page selects. ``action`` is an event kind, or a prefix of kinds when it
    ends with ``.`` (``job.``); ``object`` is what an event is about: a job id, or the node,
    user, token id, model or deployment name, or tenant its details name; ``cursor`` is the
    ``next`` of the previous page (ids below it when ``newest_first``, above it otherwise)."""

    since: float | None = None
    until: float | None = None
    actor: str | None = None
    action: str | None = None
    object: str | None = None
    cursor: int | None = None
    newest_first: bool = True
    limit: int = 100


#: The most events one audit page holds.
MAX_AUDIT_PAGE = 500
#: Keys of an event's details that name what it is about (besides ``job_id`` and ``tenant``).
_OBJECT_KEYS = ("object", "node", "user", "token_id", "name", "model")


def _audit_filters(tenants: Sequence[str] | None, query: AuditQuery) -> list[ColumnElement[bool]]:
    found: list[ColumnElement[bool]] = []
    if tenants is not None:
        found.append(events.c.tenant.in_(list(tenants)))
    if query.since is not None:
        found.append(events.c.at >= query.since)
    if query.until is not None:
        found.append(events.c.at < query.until)
    if query.actor is not None:
        found.append(events.c.actor == query.actor)
    if query.action is not None:
        found.append(_kind_is(query.action))
    if query.object is not None:
        value = query.object
        found.append(
            or_(
                events.c.job_id == value,
                and_(_kind_is("tenant."), events.c.tenant == value),
                *(events.c.details[key].as_string() == value for key in _OBJECT_KEYS),
            )
        )
    if query.cursor is not None:
        found.append(
            events.c.id < query.cursor if query.newest_first else events.c.id > query.cursor
        )
    return found


def _kind_is(action: str) -> ColumnElement[bool]:
    """``kind == action``, or a range of kinds (which the kind index serves, unlike LIKE on
    PostgreSQL's default collation) for a prefix such as ``job.``."""
    if not action.endswith("."):
        return events.c.kind == action
    return and_(events.c.kind >= action, events.c.kind < action[:-1] + chr(ord(action[-1]) + 1))


def _reason(value: PendingReason | str | None) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, PendingReason):
        return value.code.value, value.message[:1024]
    return None, value[:1024]


def _transition_values(
    row: Row[Any],
    to_state: JobState,
    now: float,
    reason: str | None,
    exit_code: int | None,
    failure: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    values: dict[str, Any] = {"state": to_state.value, "updated_at": now}
    if to_state is JobState.STARTING:
        values["attempt"] = row.attempt + 1
    if to_state is JobState.RESTARTING:
        values["restarts"] = row.restarts + 1
    if to_state is JobState.RUNNING and row.started_at is None:
        values["started_at"] = now
    if to_state is JobState.PENDING:
        values["placement"] = None
    else:
        values["pending_code"] = values["pending_reason"] = None
    if to_state in TERMINAL_STATES:
        failed = dict(failure) if failure is not None else None
        values.update(finished_at=now, exit_code=exit_code, exit_message=reason, failure=failed)
    return values


def _find(connection: Connection, tenant: str | None, job_id: str, lock: bool = False) -> Row[Any]:
    query = select(jobs).where(jobs.c.id == job_id)
    if tenant is not None:
        query = query.where(jobs.c.tenant == tenant)
    if lock:  # PostgreSQL row lock; SQLite's BEGIN IMMEDIATE already excludes other writers
        query = query.with_for_update()
    row = connection.execute(query).first()
    if row is None:
        raise NotFound(f"no job {job_id!r}")
    return row


def _update(connection: Connection, row: Row[Any], values: dict[str, Any]) -> None:
    values["version"] = row.version + 1
    result = connection.execute(
        update(jobs).where(jobs.c.id == row.id, jobs.c.version == row.version).values(values)
    )
    if result.rowcount != 1:  # cannot happen under the row lock; kept as a tripwire
        raise StaleState(f"job {row.id} changed concurrently")


def job_record(row: Row[Any], changes: Mapping[str, Any] | None = None) -> JobRecord:
    data = dict(row._mapping)
    data.update(changes or {})
    return job_record_from(data, JobSpec.model_validate(data["spec"]))


def job_record_from(data: Mapping[str, Any], spec: JobSpec) -> JobRecord:
    return JobRecord(
        id=data["id"],
        tenant=data["tenant"],
        name=data["name"],
        spec=spec,
        spec_hash=data["spec_hash"],
        state=JobState(data["state"]),
        priority=data["priority"],
        submitted_by=data["submitted_by"],
        submitted_at=data["submitted_at"],
        updated_at=data["updated_at"],
        started_at=data.get("started_at"),
        finished_at=data.get("finished_at"),
        placement=data.get("placement"),
        progress=data.get("progress"),
        attempt=data["attempt"],
        restarts=data["restarts"],
        pending_code=data.get("pending_code"),
        pending_reason=data.get("pending_reason"),
        exit_code=data.get("exit_code"),
        exit_message=data.get("exit_message"),
        failure=data.get("failure"),
        cancel_requested_at=data.get("cancel_requested_at"),
        idempotency_key=data.get("idempotency_key"),
        version=data["version"],
        kind=data.get("kind") or "batch",
        service=data.get("service"),
    )
