"""Immutable records the store returns: jobs, events, nodes, users, tokens and principals.

Rows never leave the store as ORM objects or SQLAlchemy rows: callers get frozen dataclasses that
stay valid after the transaction that read them has ended. Times are Unix seconds (UTC).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from aicluster.core import DomainLevel, Job, JobSpec, JobState, Node, Placement, Slot

__all__ = [
    "EventRecord",
    "IssuedToken",
    "JobRecord",
    "ModelVersionRecord",
    "NodeHealth",
    "NodeRecord",
    "Principal",
    "Role",
    "TokenInfo",
    "UserRecord",
    "placement_from_json",
    "placement_to_json",
]


class Role(StrEnum):
    """A user's role in one tenant; each role can do everything the ones below it can."""

    VIEWER = "viewer"  # read jobs, events, quotas
    MEMBER = "member"  # also submit and cancel jobs
    ADMIN = "admin"  # also manage the tenant's members and tokens

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def allows(self, needed: Role) -> bool:
        return self.rank >= needed.rank


_RANKS = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2}


class NodeHealth(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"  # failed a health check: nothing new is placed there
    CORDONED = "cordoned"  # taken out by an operator (maintenance): nothing new is placed there
    DRAINING = "draining"  # cordoned, and its jobs are moved elsewhere (checkpoint, requeue)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a bearer token speaks for: a user, its role per tenant, and whether it operates the
    whole cluster (a cluster admin is an admin of every tenant)."""

    user: str
    roles: Mapping[str, Role] = field(default_factory=dict)
    cluster_admin: bool = False
    token_id: str | None = None
    #: When the token stops authenticating (None: never); a cache must not outlive it.
    expires_at: float | None = None

    def role_in(self, tenant: str) -> Role | None:
        return Role.ADMIN if self.cluster_admin else self.roles.get(tenant)

    def can(self, tenant: str, needed: Role) -> bool:
        """True when this principal holds ``needed`` (or a higher role) in ``tenant``."""
        role = self.role_in(tenant)
        return role is not None and role.allows(needed)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored: its spec, where it is in the state machine, and its history counters.

    ``attempt`` counts launches (entries into STARTING); ``restarts`` counts entries into
    RESTARTING. ``version`` grows with every change (optimistic concurrency).
    """

    id: str
    tenant: str
    name: str
    spec: JobSpec
    spec_hash: str
    state: JobState
    priority: int
    submitted_by: str
    submitted_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    placement: Mapping[str, Any] | None = None
    progress: Mapping[str, Any] | None = None  # what its interrupted runs left it (JSON)
    attempt: int = 0
    restarts: int = 0
    pending_code: str | None = None
    pending_reason: str | None = None
    exit_code: int | None = None
    exit_message: str | None = None
    #: How a FAILED job's last attempt failed (``core.failure.Failure.to_json``): its first
    #: failed rank and node, exit code or signal, and the last lines of its stderr.
    failure: Mapping[str, Any] | None = None
    cancel_requested_at: float | None = None
    idempotency_key: str | None = None
    version: int = 1
    kind: str = "batch"  # or "service": a model deployment's replica
    service: Mapping[str, Any] | None = None  # a service's {"model": name, "version": n}

    @property
    def is_service(self) -> bool:
        return self.kind == "service"

    def to_job(self) -> Job:
        """The scheduler's view of this job (submit time = the store's acknowledgement time)."""
        return self.spec.to_job(self.id, self.submitted_at, tenant=self.tenant)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One line of the append-only event and audit log."""

    id: int
    at: float
    actor: str
    kind: str
    tenant: str | None = None
    job_id: str | None = None
    from_state: str | None = None
    to_state: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelVersionRecord:
    """One registered, immutable model version and its lineage.

    ``artifact_dir`` is the absolute path of the artifact (``weights.safetensors``,
    ``model.json``, ``code/``; see :mod:`aicluster.train.export`); ``meta`` is its ``model.json``.
    ``code_version`` is the SHA-256 of the code snapshot; ``job_id`` and ``spec_hash`` name the
    job that trained it (None when registered from files); ``parent`` the model version the
    job started from (its spec's ``model.parent``).
    """

    tenant: str
    name: str
    version: int
    artifact_dir: Path
    meta: Mapping[str, Any]
    code_version: str
    metrics: Mapping[str, float]
    registered_by: str
    registered_at: float
    job_id: str | None = None
    spec_hash: str | None = None
    dataset_hash: str | None = None
    parent: str | None = None  # NAME:VERSION it was trained from

    @property
    def ref(self) -> str:
        """``name:version``, as the CLI writes it."""
        return f"{self.name}:{self.version}"


@dataclass(frozen=True, slots=True)
class NodeRecord:
    node: Node
    health: NodeHealth
    registered_at: float
    health_reason: str | None = None
    last_seen: float | None = None
    #: Power saving's state (``core.power.PowerState`` values; "on" covers idle) and when a
    #: suspend or resume under way is expected done.
    power: str = "on"
    power_until: float | None = None

    @property
    def schedulable(self) -> bool:
        return self.health is NodeHealth.HEALTHY


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    created_at: float
    cluster_admin: bool = False
    disabled: bool = False
    roles: Mapping[str, Role] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token's metadata; the secret itself is never stored, only its SHA-256."""

    id: str
    user: str
    created_at: float
    description: str = ""
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None

    def active(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A new token: ``token`` is the plaintext, shown once and never retrievable again."""

    info: TokenInfo
    token: str = field(repr=False)


def placement_to_json(placement: Placement) -> dict[str, Any]:
    """A core :class:`Placement` as JSON data (slots as ``[node, gpus, nvlink_domain, cpus,
    memory_gb]``; placements stored before CPUs and memory were placed have the first three)."""
    return {
        "level": placement.level.label,
        "domain": placement.domain,
        "slots": [
            [slot.node, slot.gpus, slot.nvlink_domain, slot.cpus, slot.memory_gb]
            for slot in placement.slots
        ],
        "score": dict(placement.score),
    }


def _slot_from_json(data: Sequence[Any]) -> Slot:
    node, gpus, nvlink_domain, *host = data
    cpus, memory_gb = (float(host[0]), float(host[1])) if host else (0.0, 0.0)
    return Slot(str(node), int(gpus), int(nvlink_domain), cpus, memory_gb)


def placement_from_json(data: Mapping[str, Any]) -> Placement:
    """Inverse of :func:`placement_to_json`. Raises ``KeyError``/``ValueError`` on bad data."""
    return Placement(
        slots=tuple(_slot_from_json(slot) for slot in data["slots"]),
        level=DomainLevel.parse(str(data["level"])),
        domain=str(data["domain"]),
        score={str(k): float(v) for k, v in dict(data.get("score", {})).items()},
    )
