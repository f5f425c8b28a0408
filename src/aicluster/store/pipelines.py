"""Continuous-learning pipelines as stored: one row per pipeline (its spec, paused or not, the
trigger evaluator's memory) and one per run.

A run moves ``starting`` (fired; its job not yet stored) → ``training`` (its job submitted) →
``rolling_out`` (the job's model registered, a canary started) → ``promoted`` |
``rolled_back``; or ``failed`` from any of the first three. At most one run of a pipeline is in
progress: :meth:`PipelineOps.start_pipeline_run` checks it under the pipeline's row lock. Every
change appends its event (``pipeline.*``) in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.errors import Conflict, NotFound, StaleState

__all__ = [
    "ACTIVE_RUN_STATES",
    "MAX_PIPELINES_PER_TENANT",
    "PipelineOps",
    "PipelineRecord",
    "PipelineRunRecord",
]

pipelines = schema.pipelines
runs = schema.pipeline_runs
#: A run in one of these states is in progress.
ACTIVE_RUN_STATES = ("starting", "training", "rolling_out")
#: The most pipelines one tenant may have. Each runs one job at a time, submitted by the leader
#: rather than through the API's per-tenant cap on pending jobs, so this bounds what a tenant's
#: pipelines can queue at once.
MAX_PIPELINES_PER_TENANT = 100
_ENDED = ("promoted", "rolled_back", "failed")
#: The event each state's arrival appends.
_EVENTS = {
    "training": "pipeline.job_submitted",
    "rolling_out": "pipeline.canary_started",
    "promoted": "pipeline.promoted",
    "rolled_back": "pipeline.rolled_back",
    "failed": "pipeline.failed",
}


@dataclass(frozen=True)
class PipelineRecord:
    id: int
    tenant: str
    name: str
    spec: Mapping[str, Any]
    paused: bool
    memory: Mapping[str, Any]
    created_by: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class PipelineRunRecord:
    id: int
    pipeline_id: int
    tenant: str
    state: str
    reasons: tuple[str, ...]
    job_id: str | None
    model_version: int | None
    rollout_id: int | None
    detail: str | None
    started_at: float
    ended_at: float | None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_RUN_STATES


class PipelineOps(StoreBase):
    """Creating, reading, pausing and running pipelines (mixed into ``Store``)."""

    def create_pipeline(
        self,
        tenant: str,
        name: str,
        spec: Mapping[str, Any],
        memory: Mapping[str, Any],
        actor: str,
    ) -> PipelineRecord:
        """Raises :class:`Conflict` when the tenant has a pipeline of that name, or
        :data:`MAX_PIPELINES_PER_TENANT` already."""
        now = self._now()
        values = {
            "tenant": tenant,
            "name": name,
            "spec": dict(spec),
            "paused": False,
            "memory": dict(memory),
            "created_by": actor,
            "created_at": now,
            "updated_at": now,
        }
        try:
            with self._write() as connection:
                held = connection.execute(
                    select(func.count()).select_from(pipelines).where(pipelines.c.tenant == tenant)
                ).scalar_one()
                if held >= MAX_PIPELINES_PER_TENANT:
                    raise Conflict(
                        f"tenant {tenant!r} has {held} pipelines, the most one tenant may have; "
                        "delete one first"
                    )
                result = connection.execute(insert(pipelines).returning(pipelines.c.id), values)
                values["id"] = result.scalar_one()
                self._event(connection, actor, "pipeline.created", tenant, name, {})
        except IntegrityError:
            raise Conflict(f"tenant {tenant!r} already has a pipeline {name!r}") from None
        return _pipeline(values)

    def list_pipelines(self, tenant: str | None) -> list[PipelineRecord]:
        """A tenant's pipelines (every tenant's with None), by tenant and name."""
        query = select(pipelines).order_by(pipelines.c.tenant, pipelines.c.name)
        if tenant is not None:
            query = query.where(pipelines.c.tenant == tenant)
        with self._read() as connection:
            return [_pipeline(dict(row._mapping)) for row in connection.execute(query)]

    def get_pipeline(self, tenant: str, name: str) -> PipelineRecord:
        """Raises :class:`NotFound` (also for another tenant's pipeline)."""
        with self._read() as connection:
            return _pipeline(dict(_row(connection, tenant, name)._mapping))

    def set_pipeline_paused(
        self, tenant: str, name: str, paused: bool, actor: str
    ) -> PipelineRecord:
        """Pause (no new run fires; one in progress goes on) or resume a pipeline."""
        with self._write() as connection:
            row = _row(connection, tenant, name, lock=True)
            connection.execute(
                update(pipelines)
                .where(pipelines.c.id == row.id)
                .values(paused=paused, updated_at=self._now())
            )
            kind = "pipeline.paused" if paused else "pipeline.resumed"
            self._event(connection, actor, kind, tenant, name, {})
            return _pipeline({**row._mapping, "paused": paused})

    def delete_pipeline(self, tenant: str, name: str, actor: str) -> None:
        """Delete a pipeline and its runs' rows (a job or rollout it started goes on alone)."""
        with self._write() as connection:
            row = _row(connection, tenant, name, lock=True)
            connection.execute(delete(runs).where(runs.c.pipeline_id == row.id))
            connection.execute(delete(pipelines).where(pipelines.c.id == row.id))
            self._event(connection, actor, "pipeline.deleted", tenant, name, {})

    def save_pipeline_memory(self, pipeline_id: int, memory: Mapping[str, Any]) -> None:
        """Store the evaluator's memory (no event: it changes every look while drift lasts)."""
        with self._write() as connection:
            connection.execute(
                update(pipelines).where(pipelines.c.id == pipeline_id).values(memory=dict(memory))
            )

    def pipeline_runs(self, pipeline_id: int, limit: int = 20) -> list[PipelineRunRecord]:
        """A pipeline's runs, newest first."""
        query = (
            select(runs)
            .where(runs.c.pipeline_id == pipeline_id)
            .order_by(runs.c.id.desc())
            .limit(max(1, min(limit, 1000)))
        )
        with self._read() as connection:
            return [_run(dict(row._mapping)) for row in connection.execute(query)]

    def start_pipeline_run(
        self,
        pipeline: PipelineRecord,
        reasons: Sequence[str],
        memory: Mapping[str, Any],
        actor: str,
    ) -> PipelineRunRecord:
        """Fire: a new run in state ``starting`` and the memory the evaluator returned, in one
        transaction. Raises :class:`Conflict` while a run is in progress, :class:`NotFound`
        once the pipeline is gone, :class:`StaleState` once it is paused."""
        now = self._now()
        with self._write() as connection:
            row = _row(connection, pipeline.tenant, pipeline.name, lock=True)
            if row.id != pipeline.id:
                raise NotFound(f"pipeline {pipeline.name!r} was replaced")
            if row.paused:
                raise StaleState(f"pipeline {pipeline.name!r} is paused")
            busy = connection.execute(
                select(runs.c.id).where(
                    runs.c.pipeline_id == row.id, runs.c.state.in_(ACTIVE_RUN_STATES)
                )
            ).first()
            if busy is not None:
                raise Conflict(f"pipeline {pipeline.name!r} already runs (run {busy.id})")
            values: dict[str, Any] = {
                "pipeline_id": row.id,
                "tenant": row.tenant,
                "state": "starting",
                "reasons": list(reasons),
                "job_id": None,
                "model_version": None,
                "rollout_id": None,
                "detail": None,
                "started_at": now,
                "ended_at": None,
            }
            values["id"] = connection.execute(
                insert(runs).returning(runs.c.id), values
            ).scalar_one()
            connection.execute(
                update(pipelines).where(pipelines.c.id == row.id).values(memory=dict(memory))
            )
            details = {"run": values["id"], "reasons": list(reasons)}
            self._event(connection, actor, "pipeline.fired", row.tenant, row.name, details)
        return _run(values)

    def move_pipeline_run(
        self, run: PipelineRunRecord, state: str, actor: str, **changes: Any
    ) -> PipelineRunRecord:
        """Move ``run`` from its state to ``state`` (compare-and-set) with ``changes``
        (``job_id``, ``model_version``, ``rollout_id``, ``detail``) and the state's event; an
        ended run also sets the pipeline's ``memory.last_ended``. Raises :class:`StaleState`."""
        now = self._now()
        values = {**changes, "state": state}
        if state in _ENDED:
            values["ended_at"] = now
        with self._write() as connection:
            moved = connection.execute(
                update(runs).where(runs.c.id == run.id, runs.c.state == run.state).values(values)
            ).rowcount
            if not moved:
                raise StaleState(f"pipeline run {run.id} is no longer {run.state}")
            parent = connection.execute(
                select(pipelines).where(pipelines.c.id == run.pipeline_id)
            ).first()
            name = parent.name if parent is not None else "?"
            if parent is not None and state in _ENDED:
                memory = {**parent.memory, "last_ended": now}
                connection.execute(
                    update(pipelines).where(pipelines.c.id == parent.id).values(memory=memory)
                )
            details = {"run": run.id, **{k: v for k, v in changes.items() if v is not None}}
            self._event(connection, actor, _EVENTS[state], run.tenant, name, details)
        return _run({**_as_dict(run), **values})

    def _event(
        self,
        connection: Connection,
        actor: str,
        kind: str,
        tenant: str,
        name: str,
        details: Mapping[str, Any],
    ) -> None:
        details = {"pipeline": name, **details}
        self._log(connection, actor=actor, kind=kind, tenant=tenant, details=details)


def _row(connection: Connection, tenant: str, name: str, *, lock: bool = False) -> Any:
    query = select(pipelines).where(pipelines.c.tenant == tenant, pipelines.c.name == name)
    row = connection.execute(query.with_for_update() if lock else query).first()
    if row is None:
        raise NotFound(f"tenant {tenant!r} has no pipeline {name!r}")
    return row


def _pipeline(row: Mapping[str, Any]) -> PipelineRecord:
    return PipelineRecord(
        id=int(row["id"]),
        tenant=row["tenant"],
        name=row["name"],
        spec=row["spec"],
        paused=bool(row["paused"]),
        memory=row["memory"],
        created_by=row["created_by"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


def _run(row: Mapping[str, Any]) -> PipelineRunRecord:
    return PipelineRunRecord(
        id=int(row["id"]),
        pipeline_id=int(row["pipeline_id"]),
        tenant=row["tenant"],
        state=row["state"],
        reasons=tuple(row["reasons"]),
        job_id=row["job_id"],
        model_version=row["model_version"],
        rollout_id=row["rollout_id"],
        detail=row["detail"],
        started_at=float(row["started_at"]),
        ended_at=row["ended_at"],
    )


def _as_dict(run: PipelineRunRecord) -> dict[str, Any]:
    return {**vars(run), "reasons": list(run.reasons)}
