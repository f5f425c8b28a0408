"""Tenants (quotas, borrowing limits, weights) and nodes (topology, health, last seen)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Row, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from aicluster.core import Node, Tenant
from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.errors import Conflict, NotFound
from aicluster.store.records import NodeHealth, NodeRecord

__all__ = ["ClusterOps"]

tenants, nodes = schema.tenants, schema.nodes


class ClusterOps(StoreBase):
    def create_tenant(self, tenant: Tenant, actor: str) -> Tenant:
        """Create a tenant. Raises :class:`Conflict` if one of that name exists."""
        now = self._now()
        try:
            with self._write() as connection:
                connection.execute(
                    insert(tenants).values(
                        _tenant_values(tenant) | {"created_at": now, "updated_at": now}
                    )
                )
                self._log(
                    connection,
                    actor=actor,
                    kind="tenant.created",
                    tenant=tenant.name,
                    details=_tenant_values(tenant),
                )
        except IntegrityError:
            raise Conflict(f"tenant {tenant.name!r} already exists") from None
        return tenant

    def put_tenant(self, tenant: Tenant, actor: str) -> Tenant:
        """Create the tenant or replace its quotas, borrowing limit and weight. Idempotent."""
        with self._write() as connection:
            row = connection.execute(
                select(tenants).where(tenants.c.name == tenant.name).with_for_update()
            ).first()
            values = _tenant_values(tenant)
            if row is not None and _tenant(row) == tenant:
                return tenant
            now = self._now()
            if row is None:
                connection.execute(
                    insert(tenants).values(values | {"created_at": now, "updated_at": now})
                )
            else:
                connection.execute(
                    update(tenants)
                    .where(tenants.c.name == tenant.name)
                    .values(values | {"updated_at": now})
                )
            kind = "tenant.created" if row is None else "tenant.updated"
            self._log(connection, actor=actor, kind=kind, tenant=tenant.name, details=values)
        return tenant

    def get_tenant(self, name: str) -> Tenant:
        """Raises :class:`NotFound`."""
        with self._read() as connection:
            row = connection.execute(select(tenants).where(tenants.c.name == name)).first()
        if row is None:
            raise NotFound(f"no tenant {name!r}")
        return _tenant(row)

    def tenant_uid(self, name: str, first: int, last: int) -> int:
        """The uid of ``name``'s sandboxes (also its gid), given on first use: the lowest free one
        of ``first..last``, kept for good, so the same on every node. Raises :class:`NotFound`,
        and :class:`Conflict` when the range is used up."""
        for _ in range(3):  # two servers giving the same uid at once: the unique index decides
            with self._read() as connection:
                row = connection.execute(
                    select(tenants.c.uid).where(tenants.c.name == name)
                ).first()
                if row is None:
                    raise NotFound(f"no tenant {name!r}")
                if row.uid is not None:
                    return int(row.uid)
                taken = {
                    int(uid)
                    for (uid,) in connection.execute(
                        select(tenants.c.uid).where(tenants.c.uid.is_not(None))
                    )
                }
            free = next((uid for uid in range(first, last + 1) if uid not in taken), None)
            if free is None:
                raise Conflict(f"no free sandbox uid in {first}..{last} for tenant {name!r}")
            try:
                with self._write() as connection:
                    connection.execute(
                        update(tenants)
                        .where(tenants.c.name == name, tenants.c.uid.is_(None))
                        .values(uid=free)
                    )
            except IntegrityError:
                continue
        return self._uid_of(name)

    def _uid_of(self, name: str) -> int:
        with self._read() as connection:
            row = connection.execute(select(tenants.c.uid).where(tenants.c.name == name)).first()
        if row is None or row.uid is None:
            raise Conflict(f"could not give tenant {name!r} a sandbox uid")
        return int(row.uid)

    def list_tenants(self) -> list[Tenant]:
        with self._read() as connection:
            return [_tenant(row) for row in connection.execute(select(tenants).order_by("name"))]

    def delete_tenant(self, name: str, actor: str) -> None:
        """Delete a tenant with no jobs (its role bindings go with it).

        Raises :class:`NotFound`, and :class:`Conflict` while any of its jobs is stored.
        """
        with self._write() as connection:
            has_jobs = connection.execute(
                select(schema.jobs.c.id).where(schema.jobs.c.tenant == name).limit(1)
            ).first()
            if has_jobs is not None:
                raise Conflict(f"tenant {name!r} still has jobs")
            if not connection.execute(delete(tenants).where(tenants.c.name == name)).rowcount:
                raise NotFound(f"no tenant {name!r}")
            self._log(connection, actor=actor, kind="tenant.deleted", tenant=name)

    def upsert_nodes(
        self, found: Iterable[Node], *, seen_at: float | None = None, actor: str = "control"
    ) -> int:
        """Register nodes or refresh their topology and ``last_seen``, in one transaction.

        Health is kept (a cordoned node stays cordoned); new nodes start healthy. Idempotent.
        Returns how many nodes were new; each new node is logged.
        """
        now = self._now()
        seen = now if seen_at is None else seen_at
        added = 0
        with self._write() as connection:
            known = {row.name for row in connection.execute(select(nodes.c.name))}
            for node in found:
                values = _node_values(node) | {"last_seen": seen}
                if node.name in known:
                    connection.execute(
                        update(nodes).where(nodes.c.name == node.name).values(values)
                    )
                    continue
                connection.execute(
                    insert(nodes).values(
                        values | {"health": NodeHealth.HEALTHY.value, "registered_at": now}
                    )
                )
                known.add(node.name)
                added += 1
                self._log(
                    connection, actor=actor, kind="node.registered", details=_node_values(node)
                )
        return added

    def list_nodes(self) -> list[NodeRecord]:
        with self._read() as connection:
            return [_node(row) for row in connection.execute(select(nodes).order_by(nodes.c.name))]

    def get_node(self, name: str) -> NodeRecord:
        """Raises :class:`NotFound`."""
        with self._read() as connection:
            row = connection.execute(select(nodes).where(nodes.c.name == name)).first()
        if row is None:
            raise NotFound(f"no node {name!r}")
        return _node(row)

    def set_node_health(
        self, name: str, health: NodeHealth, actor: str, reason: str | None = None
    ) -> NodeRecord:
        """Mark a node healthy, unhealthy or cordoned, and log who did. Idempotent.

        Raises :class:`NotFound`.
        """
        health = NodeHealth(health)
        with self._write() as connection:
            row = connection.execute(
                select(nodes).where(nodes.c.name == name).with_for_update()
            ).first()
            if row is None:
                raise NotFound(f"no node {name!r}")
            if (row.health, row.health_reason) == (health.value, reason):
                return _node(row)
            connection.execute(
                update(nodes)
                .where(nodes.c.name == name)
                .values(health=health.value, health_reason=reason)
            )
            self._log(
                connection,
                actor=actor,
                kind="node.health",
                from_state=row.health,
                to_state=health.value,
                details={"node": name, "reason": reason},
            )
        return _node(row, health=health.value, health_reason=reason)

    def set_node_power(
        self,
        name: str,
        power: str,
        actor: str,
        *,
        until: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Record a node's power state (and when a suspend or resume is expected done), and log
        the transition as a ``node.power`` event. Raises :class:`NotFound`."""
        with self._write() as connection:
            row = connection.execute(
                select(nodes.c.power).where(nodes.c.name == name).with_for_update()
            ).first()
            if row is None:
                raise NotFound(f"no node {name!r}")
            connection.execute(
                update(nodes).where(nodes.c.name == name).values(power=power, power_until=until)
            )
            details: dict[str, Any] = {"node": name, "reason": reason}
            if until is not None:
                details["until"] = until
            self._log(
                connection,
                actor=actor,
                kind="node.power",
                from_state=row.power,
                to_state=power,
                details=details,
            )

    def remove_node(self, name: str, actor: str) -> None:
        """Forget a node (decommissioned). Raises :class:`NotFound`."""
        with self._write() as connection:
            if not connection.execute(delete(nodes).where(nodes.c.name == name)).rowcount:
                raise NotFound(f"no node {name!r}")
            self._log(connection, actor=actor, kind="node.removed", details={"node": name})

    def record_cluster_event(
        self,
        kind: str,
        actor: str,
        details: Mapping[str, Any] | None = None,
        tenant: str | None = None,
    ) -> None:
        """Append an event about the cluster rather than one job (e.g. leftovers removed), of
        ``tenant`` when it concerns one."""
        with self._write() as connection:
            self._log(connection, actor=actor, kind=kind, tenant=tenant, details=details)


def _tenant_values(tenant: Tenant) -> dict[str, Any]:
    return {
        "name": tenant.name,
        "quota": dict(tenant.quota),
        "borrow_limit": dict(tenant.borrow_limit),
        "weight": tenant.weight,
        "cpu_quota": tenant.cpu_quota,
        "memory_quota_gb": tenant.memory_quota_gb,
    }


def _tenant(row: Row[Any]) -> Tenant:
    return Tenant(
        name=row.name,
        quota={str(k): int(v) for k, v in row.quota.items()},
        borrow_limit={str(k): int(v) for k, v in row.borrow_limit.items()},
        weight=row.weight,
        cpu_quota=row.cpu_quota,
        memory_quota_gb=row.memory_quota_gb,
    )


def _node_values(node: Node) -> dict[str, Any]:
    return {
        "name": node.name,
        "rack": node.rack,
        "pod": node.pod,
        "gpu_type": node.gpu_type,
        "gpus": node.gpus,
        "cpus": node.cpus,
        "memory_gb": node.memory_gb,
        "nvlink_domain_size": node.nvlink_domain_size,
        "labels": dict(node.labels),
    }


def _node(row: Row[Any], **changes: Any) -> NodeRecord:
    data = dict(row._mapping) | changes
    node = Node(
        name=data["name"],
        gpus=data["gpus"],
        gpu_type=data["gpu_type"],
        rack=data["rack"],
        pod=data["pod"],
        cpus=data["cpus"],
        memory_gb=data["memory_gb"],
        nvlink_domain_size=data["nvlink_domain_size"],
        labels=dict(data["labels"]),
    )
    return NodeRecord(
        node=node,
        health=NodeHealth(data["health"]),
        registered_at=data["registered_at"],
        health_reason=data["health_reason"],
        last_seen=data["last_seen"],
        power=data["power"],
        power_until=data["power_until"],
    )
