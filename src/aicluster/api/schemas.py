"""Response bodies of the REST API (requests use :class:`aicluster.core.JobSpec` and these)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import quote

from pydantic import BaseModel, Field, ValidationError

from aicluster.api.params import ID_PATTERN, NAME_PATTERN, TEXT_PATTERN, USER_PATTERN
from aicluster.core import Tenant
from aicluster.store import (
    DeploymentRecord,
    EventRecord,
    JobRecord,
    ModelVersionRecord,
    NodeRecord,
    Role,
    TokenInfo,
)
from aicluster.store.lineage import ModelLineage
from aicluster.store.serving import (
    DEFAULT_REPLICA_CPUS,
    DEFAULT_REPLICA_MEMORY_GB,
    MAX_REPLICA_CPUS,
    MAX_REPLICA_MEMORY_GB,
    MAX_SERVICE_GPUS,
)

__all__ = [
    "ClusterOut",
    "CodeOut",
    "CodeStoredOut",
    "DeploymentIn",
    "DeploymentOut",
    "EventOut",
    "FailureOut",
    "JobOut",
    "MemberIn",
    "ModelOut",
    "ModelRegisterIn",
    "ModelVersionOut",
    "NodeOut",
    "Page",
    "QueueEntryOut",
    "ScoreTerm",
    "TenantIn",
    "TenantOut",
    "TokenIn",
    "TokenOut",
    "UserIn",
    "VersionServingOut",
    "WhyOut",
]

#: A pending job's estimated start (``aicluster.sim.forecast``), as the leader's loop has it.
EstimatedStart = Annotated[
    float | None,
    Field(
        description="a pending job's estimated start (Unix seconds) as the leading server's "
        "latest forecast gives it (estimates in the configuration); null: none found, none "
        "yet, not pending, or in a listing (GET /v1/jobs)",
    ),
]


class PendingOut(BaseModel):
    code: str | None
    reason: str


class FailureOut(BaseModel):
    """How a failed attempt ended (``aicluster.core.failure``): its first failed rank."""

    rank: int
    node: str
    summary: str = Field(description='in a sentence: "rank 1 on node-a exited with code 1"')
    exit_code: int | None = Field(
        None, description="the rank's exit code (negative: killed by that signal)"
    )
    signal: str | None = Field(None, description="the signal that killed it (SIGKILL)")
    lost: bool = Field(False, description="its actor or node died without an exit")
    attempt: int | None = None
    stderr_tail: list[str] = Field(
        default_factory=list,
        description="the last lines (at most 10) of its stderr, printable characters only, "
        "each at most 240 characters: a traceback's end",
    )

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> FailureOut | None:
        """The stored ``failure`` (None when there is none, or it is not of this shape)."""
        if not data:
            return None
        try:
            return cls.model_validate(dict(data))
        except ValidationError:
            return None


class JobOut(BaseModel):
    id: str
    tenant: str
    name: str
    state: str
    priority: int
    submitted_by: str
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    attempt: int
    restarts: int
    pending: PendingOut | None
    exit_code: int | None
    exit_message: str | None
    failure: FailureOut | None = Field(
        None,
        description="a FAILED job's failure: the first rank to fail in its last attempt, its "
        "node, exit code or signal, and its stderr's last lines",
    )
    cancel_requested: bool
    placement: dict[str, Any] | None
    progress: dict[str, Any] | None = Field(
        default=None,
        description="what its interrupted runs left it (attained GPU-seconds, executed seconds, "
        "restarts) when it came back to the queue; null if never interrupted",
    )
    spec: dict[str, Any]
    spec_hash: str
    kind: str = Field(default="batch", description="batch, or service: a deployment's replica")
    service: dict[str, Any] | None = Field(
        default=None, description="a service job's deployment: {model, version}"
    )
    straggler: str | None = None  # stragglers of a running job's attempt (GET /v1/jobs only)
    predicted_duration: dict[str, Any] | None = Field(
        default=None,
        description="GET /v1/jobs/{id} with prediction.enabled, from the leading server: the "
        "run time predicted at its queueing ({quantiles: {q: seconds}, source: model, request "
        "or none (no history), trained_on: jobs})",
    )
    estimated_start: EstimatedStart = None

    @classmethod
    def of(cls, job: JobRecord) -> JobOut:
        pending = None
        if job.pending_reason is not None:
            pending = PendingOut(code=job.pending_code, reason=job.pending_reason)
        return cls(
            id=job.id,
            tenant=job.tenant,
            name=job.name,
            state=job.state.value,
            priority=job.priority,
            submitted_by=job.submitted_by,
            submitted_at=job.submitted_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            attempt=job.attempt,
            restarts=job.restarts,
            pending=pending,
            exit_code=job.exit_code,
            exit_message=job.exit_message,
            failure=FailureOut.of(job.failure),
            cancel_requested=job.cancel_requested_at is not None,
            placement=dict(job.placement) if job.placement else None,
            progress=dict(job.progress) if job.progress else None,
            spec=job.spec.canonical_dict(),
            spec_hash=job.spec_hash,
            kind=job.kind,
            service=dict(job.service) if job.service else None,
        )


class Page(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None


class EventOut(BaseModel):
    id: int
    at: float
    actor: str
    kind: str
    tenant: str | None
    job_id: str | None
    from_state: str | None
    to_state: str | None
    details: dict[str, Any]

    @classmethod
    def of(cls, event: EventRecord) -> EventOut:
        return cls(
            id=event.id,
            at=event.at,
            actor=event.actor,
            kind=event.kind,
            tenant=event.tenant,
            job_id=event.job_id,
            from_state=event.from_state,
            to_state=event.to_state,
            details=dict(event.details),
        )


class QueueEntryOut(BaseModel):
    position: int = Field(description="1-based place in the cluster-wide scheduling order")
    job_id: str
    tenant: str
    name: str
    priority: int
    gpus: int
    waiting_seconds: float
    code: str | None
    reason: str
    estimated_start: EstimatedStart = None


class ScoreTerm(BaseModel):
    term: str
    value: float
    meaning: str


class WhyOut(BaseModel):
    job_id: str
    state: str
    position: int | None
    code: str | None
    reason: str
    estimated_start: EstimatedStart = None
    placement: dict[str, Any] | None
    score: list[ScoreTerm] = Field(
        default_factory=list, description="the placement's score, term by term, with meanings"
    )
    straggler: str | None = Field(None, description="stragglers flagged in the latest attempt")
    data: dict[str, Any] | None = Field(
        None,
        description="reading its datasets, latest attempt: cache_hits, shards_fetched, "
        "bytes_fetched, wait_seconds (GET /v1/jobs/{id}/data: per rank and node)",
    )
    failure: FailureOut | None = Field(
        None, description="a FAILED job's failure (as in GET /v1/jobs/{id}); reason: its message"
    )


class NodeOut(BaseModel):
    name: str
    rack: str
    pod: str
    gpu_type: str
    gpus: int
    gpus_used: int
    health: str
    health_reason: str | None
    power: str = Field(
        description="power saving: on, suspending, off, resuming or failed-to-resume"
    )
    power_until: float | None = Field(description="when a suspend or resume is expected done")
    last_seen: float | None
    labels: dict[str, str]

    @classmethod
    def of(cls, record: NodeRecord, used: int) -> NodeOut:
        node = record.node
        return cls(
            name=node.name,
            rack=node.rack,
            pod=node.pod,
            gpu_type=node.gpu_type,
            gpus=node.gpus,
            gpus_used=used,
            health=record.health.value,
            health_reason=record.health_reason,
            power=record.power,
            power_until=record.power_until,
            last_seen=record.last_seen,
            labels=dict(node.labels),
        )


GpuType = Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN)]
Gpus = Annotated[int, Field(ge=0, le=10_000_000)]
UserName = Annotated[str, Field(min_length=1, max_length=128, pattern=USER_PATTERN)]


class TenantIn(BaseModel):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
    quota: dict[GpuType, Gpus] = Field(default_factory=dict, max_length=64)
    borrow_limit: dict[GpuType, Gpus] = Field(default_factory=dict, max_length=64)
    weight: float = Field(default=1.0, gt=0, le=1e6)
    cpu_quota: float | None = Field(default=None, ge=0, le=1e9)
    memory_quota_gb: float | None = Field(default=None, ge=0, le=1e12)

    def to_tenant(self) -> Tenant:
        return Tenant(
            self.name,
            dict(self.quota),
            dict(self.borrow_limit),
            self.weight,
            self.cpu_quota,
            self.memory_quota_gb,
        )


class TenantOut(BaseModel):
    name: str
    quota: dict[str, int]
    borrow_limit: dict[str, int]
    weight: float
    cpu_quota: float | None = None
    memory_quota_gb: float | None = None
    used: dict[str, int]

    @classmethod
    def of(cls, tenant: Tenant, used: dict[str, int]) -> TenantOut:
        return cls(
            name=tenant.name,
            quota=dict(tenant.quota),
            borrow_limit=dict(tenant.borrow_limit),
            weight=tenant.weight,
            cpu_quota=tenant.cpu_quota,
            memory_quota_gb=tenant.memory_quota_gb,
            used=used,
        )


class PreemptionCostOut(BaseModel):
    """A tenant's cost of preemption so far (``aicluster.core.preemption_cost``)."""

    preemptions: int
    lost_gpu_hours: float
    admitted_gpu_hours: float
    evictions_per_gpu_hour: float
    by_kind: dict[str, int]
    lost_gpu_hours_by_kind: dict[str, float]


class ClusterOut(BaseModel):
    nodes: int
    healthy_nodes: int
    capacity: dict[str, int]
    used: dict[str, int]
    used_by_tenant: dict[str, dict[str, int]]
    pending_jobs: int
    running_jobs: int
    #: Per tenant the caller can see, like ``used_by_tenant``.
    preemption_cost: dict[str, PreemptionCostOut] = {}


class UserIn(BaseModel):
    name: UserName
    cluster_admin: bool = False


class MemberIn(BaseModel):
    user: UserName
    role: Role


class TokenIn(BaseModel):
    user: UserName | None = None
    description: str = Field(default="", max_length=200, pattern=TEXT_PATTERN)
    expires_in_seconds: float | None = Field(default=None, gt=0, le=10 * 365 * 86400)


class TokenOut(BaseModel):
    id: str
    user: str
    created_at: float
    description: str
    expires_at: float | None
    revoked_at: float | None
    token: str | None = Field(default=None, description="the secret, shown only when created")

    @classmethod
    def of(cls, info: TokenInfo, secret: str | None = None) -> TokenOut:
        return cls(
            id=info.id,
            user=info.user,
            created_at=info.created_at,
            description=info.description,
            expires_at=info.expires_at,
            revoked_at=info.revoked_at,
            token=secret,
        )


ModelName = Annotated[str, Field(min_length=1, max_length=63, pattern=NAME_PATTERN)]


class DeploymentIn(BaseModel):
    """Serve a model version (``aicluster serve NAME:VERSION``): a new deployment, a new scale
    for a version already served, or a rolling update to another version."""

    model: ModelName
    version: int = Field(ge=1, le=1_000_000)
    tenant: str | None = Field(default=None, max_length=63, pattern=NAME_PATTERN)
    replicas: int | None = Field(default=None, ge=1, le=64)
    min_replicas: int | None = Field(default=None, ge=0, le=64)
    max_replicas: int | None = Field(default=None, ge=1, le=64)
    target_ongoing_requests: float | None = Field(default=None, gt=0, le=1000)
    gpus: int | None = Field(
        default=None,
        ge=0,
        le=MAX_SERVICE_GPUS,
        strict=True,  # true and 1.0 are not GPU counts
        description="GPUs per replica (each replica is a job of kind service that the "
        "scheduler places under the tenant's quota)",
    )
    cpus: float | None = Field(
        default=None,
        gt=0,
        le=MAX_REPLICA_CPUS,
        strict=True,  # "1" and true are not CPU counts
        allow_inf_nan=False,
        description=f"CPUs per replica (default {DEFAULT_REPLICA_CPUS:g}), placed and capped by "
        "the tenant's CPU quota as a job's",
    )
    memory_gb: float | None = Field(
        default=None,
        ge=0,
        le=MAX_REPLICA_MEMORY_GB,
        strict=True,
        allow_inf_nan=False,
        description=f"memory (GB) per replica (default {DEFAULT_REPLICA_MEMORY_GB:g}), placed "
        "and capped by the tenant's memory quota as a job's",
    )

    def replica_host(self) -> tuple[float, float]:
        """(CPUs, memory in GB) one replica holds: as given, else the defaults."""
        cpus = DEFAULT_REPLICA_CPUS if self.cpus is None else self.cpus
        memory = DEFAULT_REPLICA_MEMORY_GB if self.memory_gb is None else self.memory_gb
        return float(cpus), float(memory)

    def scaling(self) -> dict[str, Any]:
        """The store's scaling: an autoscaling range when any bound is given, else replicas;
        with ``gpus`` when the replicas ask for GPUs."""
        scaling = self._replicas()
        if self.gpus:
            scaling["gpus"] = self.gpus
        return scaling

    def _replicas(self) -> dict[str, Any]:
        auto = (self.min_replicas, self.max_replicas, self.target_ongoing_requests)
        if all(value is None for value in auto):
            return {"replicas": self.replicas or 1}
        if self.replicas is not None:
            raise ValueError("give either replicas or an autoscaling range, not both")
        low = self.min_replicas if self.min_replicas is not None else 1
        high = self.max_replicas if self.max_replicas is not None else max(low, 1)
        target = self.target_ongoing_requests or 2.0
        return {"autoscaling": {"min": low, "max": high, "target_ongoing_requests": target}}


class VersionServingOut(BaseModel):
    version: int
    weight: float = Field(description="percent of the model's traffic")
    healthy_replicas: int
    desired_replicas: str = Field(description="a count, or min-max when autoscaling")


class DeploymentOut(BaseModel):
    tenant: str
    name: str
    scaling: dict[str, Any]
    cpus: float = Field(description="CPUs per replica")
    memory_gb: float = Field(description="memory (GB) per replica")
    versions: list[VersionServingOut]
    promote_to: int | None = Field(description="rolling update: the version taking over")
    endpoint: str
    created_by: str
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, record: DeploymentRecord, healthy: dict[int, int], base_url: str) -> DeploymentOut:
        low, high = record.replicas
        desired = str(low) if low == high else f"{low}-{high}"
        return cls(
            tenant=record.tenant,
            name=record.name,
            scaling={k: v for k, v in record.scaling.items() if k != "promote_when_healthy"},
            cpus=record.cpus,
            memory_gb=record.memory_gb,
            versions=[
                VersionServingOut(
                    version=version,
                    weight=record.traffic[version],
                    healthy_replicas=healthy.get(version, 0),
                    desired_replicas=desired,
                )
                for version in record.versions
            ],
            promote_to=record.promote_to,
            endpoint=(  # the tenant's own route, whoever else serves a model of that name
                f"{base_url.rstrip('/')}/v1/models/{quote(record.name, safe='')}/predict"
                f"?tenant={quote(record.tenant, safe='')}"
            ),
            created_by=record.created_by,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )


class DatasetUseOut(BaseModel):
    """A dataset version in a model's lineage."""

    name: str
    version: int
    ref: str
    manifest_sha256: str | None
    deleted: bool = Field(description="the version was deleted since (its hash is kept)")


class ModelVersionOut(BaseModel):
    """One registered model version and its lineage."""

    tenant: str
    name: str
    version: int
    ref: str = Field(description="NAME:VERSION")
    job_id: str | None = Field(description="the job that trained it")
    spec_hash: str | None = Field(description="SHA-256 of that job's canonical spec")
    code_version: str = Field(description="SHA-256 of the artifact's code snapshot")
    job_code: str | None = Field(
        default=None, description="SHA-256 of the code archive the training job shipped"
    )
    dataset_hash: str | None
    metrics: dict[str, float]
    registered_by: str
    registered_at: float
    entrypoint: str
    config: dict[str, Any]
    drift: dict[str, Any] | None = Field(description="the training data's reference statistics")
    parent: str | None = Field(default=None, description="MODEL:VERSION it was trained from")
    datasets: list[DatasetUseOut] = Field(
        default=[], description="the dataset versions its job read (recorded at submit)"
    )
    traffic: float | None = Field(
        default=None, description="its share of its deployment's traffic (None: not deployed)"
    )
    spec: dict[str, Any] | None = Field(
        default=None, description="the training job's spec, secrets redacted (None: job gone)"
    )

    @classmethod
    def of(
        cls,
        record: ModelVersionRecord,
        job_code: str | None = None,
        lineage: ModelLineage | None = None,
        spec: dict[str, Any] | None = None,
    ) -> ModelVersionOut:
        """``job_code``: the training job's spec's ``code`` (the record keeps the job's id)."""
        drift = record.meta.get("drift")
        uses = lineage.datasets if lineage is not None else ()
        return cls(
            parent=record.parent,
            datasets=[DatasetUseOut(**vars(use), ref=use.ref) for use in uses],
            traffic=lineage.traffic if lineage is not None else None,
            spec=spec,
            tenant=record.tenant,
            name=record.name,
            version=record.version,
            ref=record.ref,
            job_id=record.job_id,
            spec_hash=record.spec_hash,
            code_version=record.code_version,
            job_code=job_code,
            dataset_hash=record.dataset_hash,
            metrics=dict(record.metrics),
            registered_by=record.registered_by,
            registered_at=record.registered_at,
            entrypoint=str(record.meta.get("entrypoint", "")),
            config=dict(record.meta.get("config") or {}),
            drift=dict(drift) if isinstance(drift, dict) else None,
        )


class ModelOut(BaseModel):
    """A model: its latest version (versions count from 1, so that is also how many it has)."""

    tenant: str
    name: str
    latest_version: int
    registered_at: float
    registered_by: str
    metrics: dict[str, float]
    job_id: str | None

    @classmethod
    def of(cls, latest: ModelVersionRecord) -> ModelOut:
        return cls(
            tenant=latest.tenant,
            name=latest.name,
            latest_version=latest.version,
            registered_at=latest.registered_at,
            registered_by=latest.registered_by,
            metrics=dict(latest.metrics),
            job_id=latest.job_id,
        )


class ModelRegisterIn(BaseModel):
    job_id: str = Field(max_length=32, pattern=ID_PATTERN, description="a SUCCEEDED job")


class CodeOut(BaseModel):
    """A code archive the tenant has stored."""

    sha256: str
    size: int = Field(description="bytes of the archive")


class CodeStoredOut(CodeOut):
    stored: bool = Field(description="false: the tenant had stored this archive already")
