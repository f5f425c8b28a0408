"""Deployments: which model versions a tenant serves, how they scale and how traffic is split.

A deployment is one row per (tenant, model name): its ``scaling``, what one replica holds
(GPUs in the scaling, ``cpus`` and ``memory_gb`` in columns of their own) and its ``traffic`` map
(version → percent, summing to 100). Every version in the map is deployed, at 0% too (a canary
held at 0 keeps its replicas); a version dropped from the map is undeployed by the leader's
deployer once in-flight requests have drained. Each change is one transaction with its event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.errors import NotFound, StaleState

__all__ = [
    "DEFAULT_REPLICA_CPUS",
    "DEFAULT_REPLICA_MEMORY_GB",
    "MAX_REPLICA_CPUS",
    "MAX_REPLICA_MEMORY_GB",
    "MAX_SERVICE_GPUS",
    "PROMOTE_KEY",
    "DeploymentRecord",
    "ServingOps",
    "check_replica_host",
    "check_scaling",
    "check_traffic",
]

deployments, model_versions = schema.deployments, schema.model_versions

#: Key in ``scaling`` naming a version to move all traffic to once it is healthy: a rolling
#: update in flight (the leader's deployer finishes it; any traffic change cancels it).
PROMOTE_KEY = "promote_when_healthy"
#: Most GPUs one replica may ask for (``scaling["gpus"]``): a replica sits on one node.
MAX_SERVICE_GPUS = 16
#: What one replica holds when the deployment does not say: enough for a small CPU model.
DEFAULT_REPLICA_CPUS = 1.0
DEFAULT_REPLICA_MEMORY_GB = 1.0
#: Most CPUs and memory (GB) one replica may ask for (as a job's worker).
MAX_REPLICA_CPUS = 1024.0
MAX_REPLICA_MEMORY_GB = 16384.0


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """A deployment as stored. ``traffic`` maps version → percent (0..100, summing to 100);
    ``cpus`` and ``memory_gb`` are what each replica holds besides its GPUs."""

    id: int
    tenant: str
    name: str
    scaling: Mapping[str, Any]
    traffic: Mapping[int, float]
    state: str
    created_by: str
    created_at: float
    updated_at: float
    version: int
    cpus: float = DEFAULT_REPLICA_CPUS
    memory_gb: float = DEFAULT_REPLICA_MEMORY_GB

    @property
    def versions(self) -> list[int]:
        """Every deployed version (0% ones included), oldest first."""
        return sorted(self.traffic)

    @property
    def promote_to(self) -> int | None:
        """The version a rolling update will move all traffic to once healthy, if any."""
        value = self.scaling.get(PROMOTE_KEY)
        return int(value) if value is not None else None

    @property
    def gpus(self) -> int:
        """GPUs per replica (0: a CPU replica). Every replica is a job of kind ``service`` that
        the scheduler places (``aicluster.serve.services``)."""
        return int(self.scaling.get("gpus", 0))

    @property
    def replicas(self) -> tuple[int, int]:
        """(min, max) replicas the scaling asks for (equal without autoscaling)."""
        auto = self.scaling.get("autoscaling")
        if auto:
            return int(auto["min"]), int(auto["max"])
        count = int(self.scaling.get("replicas", 1))
        return count, count


def check_scaling(scaling: Mapping[str, Any]) -> dict[str, Any]:
    """The scaling in canonical form; ``ValueError`` with a readable message otherwise.

    ``{"replicas": n}`` (1..64) or ``{"autoscaling": {"min": a, "max": b,
    "target_ongoing_requests": t}}`` with 0 ≤ a ≤ b, 1 ≤ b ≤ 64, t > 0; either with ``"gpus": g``
    (0 ≤ g ≤ :data:`MAX_SERVICE_GPUS`, GPUs per replica; 0 is left out).
    """
    auto = scaling.get("autoscaling")
    if auto is not None:
        low, high = int(auto.get("min", 1)), int(auto.get("max", 1))
        target = float(auto.get("target_ongoing_requests", 2.0))
        if not (0 <= low <= high and 1 <= high <= 64):
            raise ValueError("autoscaling needs 0 <= min <= max and 1 <= max <= 64")
        if not (math.isfinite(target) and target > 0):
            raise ValueError("target_ongoing_requests must be a positive number")
        canonical: dict[str, Any] = {
            "autoscaling": {"min": low, "max": high, "target_ongoing_requests": target}
        }
    else:
        count = int(scaling.get("replicas", 1))
        if not 1 <= count <= 64:
            raise ValueError("replicas must be between 1 and 64")
        canonical = {"replicas": count}
    gpus = scaling.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_SERVICE_GPUS:
        raise ValueError(f"gpus must be a whole number between 0 and {MAX_SERVICE_GPUS}")
    if gpus:
        canonical["gpus"] = gpus
    if scaling.get(PROMOTE_KEY) is not None:
        canonical[PROMOTE_KEY] = int(scaling[PROMOTE_KEY])
    return canonical


def check_replica_host(cpus: float, memory_gb: float) -> tuple[float, float]:
    """(CPUs, memory in GB) one replica holds; ``ValueError`` with a readable message unless
    0 < CPUs ≤ :data:`MAX_REPLICA_CPUS` and 0 ≤ memory ≤ :data:`MAX_REPLICA_MEMORY_GB`."""
    for value, name in ((cpus, "cpus"), (memory_gb, "memory_gb")):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} must be a number")
    if not (math.isfinite(cpus) and 0 < cpus <= MAX_REPLICA_CPUS):
        raise ValueError(f"cpus must be above 0 and at most {MAX_REPLICA_CPUS:g}")
    if not (math.isfinite(memory_gb) and 0 <= memory_gb <= MAX_REPLICA_MEMORY_GB):
        raise ValueError(f"memory_gb must be between 0 and {MAX_REPLICA_MEMORY_GB:g}")
    return float(cpus), float(memory_gb)


def check_traffic(traffic: Mapping[Any, Any]) -> dict[int, float]:
    """Version → percent with int versions; ``ValueError`` unless every percent is finite and
    ≥ 0, versions are ≥ 1, and the percents sum to 100 (within 0.01)."""
    if not traffic:
        raise ValueError("traffic must name at least one version")
    checked: dict[int, float] = {}
    for key, value in traffic.items():
        version, percent = int(key), float(value)
        if version < 1:
            raise ValueError(f"version {key!r} is not a positive integer")
        if not (math.isfinite(percent) and 0 <= percent <= 100):
            raise ValueError(f"version {version}: a percent must be between 0 and 100")
        checked[version] = percent
    if abs(sum(checked.values()) - 100.0) > 0.01:
        raise ValueError(f"traffic percents must sum to 100, not {sum(checked.values()):g}")
    return checked


class ServingOps(StoreBase):
    """Deployments of model versions (mixed into ``Store``)."""

    def put_deployment(
        self,
        tenant: str,
        name: str,
        scaling: Mapping[str, Any],
        traffic: Mapping[int, float],
        actor: str,
        *,
        cpus: float = DEFAULT_REPLICA_CPUS,
        memory_gb: float = DEFAULT_REPLICA_MEMORY_GB,
    ) -> DeploymentRecord:
        """Create the deployment, or replace the scaling, the replicas' CPUs and memory and the
        traffic of an existing one (a deleted one comes back). Idempotent for identical values
        (no event).

        Raises ``ValueError`` for bad scaling, CPUs, memory or traffic, :class:`NotFound` when a
        version is not registered for the tenant's model.
        """
        scaling, checked = check_scaling(scaling), check_traffic(traffic)
        cpus, memory_gb = check_replica_host(cpus, memory_gb)
        with self._write() as connection:
            _check_versions(connection, tenant, name, checked)
            row = _find(connection, tenant, name, lock=True, deleted=True)
            values: dict[str, Any] = {
                "scaling": scaling,
                "cpus": cpus,
                "memory_gb": memory_gb,
                "traffic": _json(checked),
                "state": "active",
            }
            now = self._now()
            if row is not None and _same(row, values):
                return _record(row)
            if row is None:
                values |= {"tenant": tenant, "name": name, "created_by": actor}
                values |= {"created_at": now, "updated_at": now, "version": 1}
                result = connection.execute(insert(deployments).values(values))
                values["id"] = result.inserted_primary_key[0]  # type: ignore[index]
                record = _record_from(values)
            else:
                record = _update(connection, row, values | {"updated_at": now})
            self._log(
                connection,
                actor=actor,
                kind="deployment.put",
                tenant=tenant,
                details={
                    "name": name,
                    "scaling": scaling,
                    "cpus": cpus,
                    "memory_gb": memory_gb,
                    "traffic": values["traffic"],
                },
                at=now,
            )
            return record

    def get_deployment(self, tenant: str, name: str) -> DeploymentRecord:
        """The active deployment; raises :class:`NotFound` (also for another tenant's)."""
        with self._read() as connection:
            row = _find(connection, tenant, name)
        if row is None:
            raise NotFound(f"no deployment {name!r}")
        return _record(row)

    def list_deployments(self, tenant: str | None = None) -> list[DeploymentRecord]:
        """Active deployments, by tenant and name; ``tenant=None``: every tenant's."""
        query = (
            select(deployments)
            .where(deployments.c.state == "active")
            .order_by(deployments.c.tenant, deployments.c.name)
        )
        if tenant is not None:
            query = query.where(deployments.c.tenant == tenant)
        with self._read() as connection:
            return [_record(row) for row in connection.execute(query)]

    def set_traffic(
        self,
        tenant: str,
        name: str,
        traffic: Mapping[int, float],
        actor: str,
        reason: str | None = None,
        *,
        expected_version: int | None = None,
    ) -> DeploymentRecord:
        """Replace the traffic split; versions left out are undeployed after they drain, versions
        at 0% stay deployed. Cancels a pending rolling update unless it is the one finishing.

        Raises ``ValueError`` (bad split), :class:`NotFound` (no deployment, unregistered
        version), :class:`StaleState` when ``expected_version`` is given and the row moved on.
        """
        checked = check_traffic(traffic)
        with self._write() as connection:
            _check_versions(connection, tenant, name, checked)
            row = _find(connection, tenant, name, lock=True)
            if row is None:
                raise NotFound(f"no deployment {name!r}")
            if expected_version is not None and row.version != expected_version:
                raise StaleState(f"deployment {name!r} changed concurrently")
            scaling = {k: v for k, v in row.scaling.items() if k != PROMOTE_KEY}
            before = dict(row.traffic)
            values = {"traffic": _json(checked), "scaling": scaling}
            if _same(row, values):
                return _record(row)
            now = self._now()
            record = _update(connection, row, values | {"updated_at": now})
            details: dict[str, Any] = {"name": name, "from": before, "to": values["traffic"]}
            if reason:
                details["reason"] = reason
            self._log(
                connection,
                actor=actor,
                kind="deployment.traffic",
                tenant=tenant,
                details=details,
                at=now,
            )
            return record

    def delete_deployment(self, tenant: str, name: str, actor: str) -> DeploymentRecord:
        """Stop serving the model: its apps are removed by the deployer. Raises :class:`NotFound`;
        deleting a deleted deployment is a :class:`NotFound` too."""
        with self._write() as connection:
            row = _find(connection, tenant, name, lock=True)
            if row is None:
                raise NotFound(f"no deployment {name!r}")
            now = self._now()
            record = _update(connection, row, {"state": "deleted", "updated_at": now})
            self._log(
                connection,
                actor=actor,
                kind="deployment.deleted",
                tenant=tenant,
                details={"name": name, "traffic": dict(row.traffic)},
                at=now,
            )
            return record

    def record_deployment_event(
        self, tenant: str, name: str, kind: str, actor: str, details: Mapping[str, Any]
    ) -> None:
        """Append an observation about a deployment (drift, health) to the event log."""
        with self._write() as connection:
            self._log(
                connection,
                actor=actor,
                kind=kind,
                tenant=tenant,
                details={"name": name, **details},
            )


def _json(traffic: Mapping[int, float]) -> dict[str, float]:
    return {str(version): percent for version, percent in sorted(traffic.items())}


def _check_versions(
    connection: Connection, tenant: str, name: str, traffic: Mapping[int, float]
) -> None:
    query = select(model_versions.c.version).where(
        model_versions.c.tenant == tenant,
        model_versions.c.name == name,
        model_versions.c.version.in_(list(traffic)),
    )
    found = {row.version for row in connection.execute(query)}
    missing = sorted(set(traffic) - found)
    if missing:
        raise NotFound(f"model {name!r} has no version {', '.join(map(str, missing))}")


def _find(
    connection: Connection, tenant: str, name: str, *, lock: bool = False, deleted: bool = False
) -> Row[Any] | None:
    query = select(deployments).where(deployments.c.tenant == tenant, deployments.c.name == name)
    if not deleted:
        query = query.where(deployments.c.state == "active")
    if lock:
        query = query.with_for_update()
    return connection.execute(query).first()


def _same(row: Row[Any], values: Mapping[str, Any]) -> bool:
    return all(getattr(row, key) == value for key, value in values.items())


def _update(connection: Connection, row: Row[Any], values: dict[str, Any]) -> DeploymentRecord:
    values["version"] = row.version + 1
    result = connection.execute(
        update(deployments)
        .where(deployments.c.id == row.id, deployments.c.version == row.version)
        .values(values)
    )
    if result.rowcount != 1:  # cannot happen under the row lock; kept as a tripwire
        raise StaleState(f"deployment {row.name!r} changed concurrently")
    return _record_from({**row._mapping, **values})


def _record(row: Row[Any]) -> DeploymentRecord:
    return _record_from(dict(row._mapping))


def _record_from(data: Mapping[str, Any]) -> DeploymentRecord:
    return DeploymentRecord(
        id=data["id"],
        tenant=data["tenant"],
        name=data["name"],
        scaling=dict(data["scaling"]),
        traffic={int(k): float(v) for k, v in data["traffic"].items()},
        state=data["state"],
        created_by=data["created_by"],
        created_at=data["created_at"],
        updated_at=data["updated_at"],
        version=data["version"],
        cpus=float(data["cpus"]),
        memory_gb=float(data["memory_gb"]),
    )
