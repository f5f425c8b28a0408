"""Table definitions (SQLAlchemy Core): the schema as the code sees it at migration head.

Migrations under ``migrations/versions`` create and change these tables; a test checks that the
migrated database and this metadata agree. Times are Unix seconds (UTC) in ``Float`` columns:
one representation for SQLite, PostgreSQL, the scheduler and the simulator.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB

__all__ = [
    "api_tokens",
    "configs",
    "dataset_versions",
    "deployments",
    "events",
    "job_datasets",
    "jobs",
    "leases",
    "metadata",
    "model_datasets",
    "model_versions",
    "nodes",
    "pipeline_runs",
    "pipelines",
    "role_bindings",
    "rollouts",
    "tenants",
    "users",
]

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: JSON text on SQLite, JSONB on PostgreSQL (indexable, compact).
Json = JSON().with_variant(JSONB(), "postgresql")
#: 64-bit on PostgreSQL; on SQLite only ``INTEGER PRIMARY KEY`` is the auto-incrementing rowid.
BigId = BigInteger().with_variant(Integer(), "sqlite")

tenants = Table(
    "tenants",
    metadata,
    Column("name", String(63), primary_key=True),
    Column("quota", Json, nullable=False),  # {gpu_type: gpus}
    Column("borrow_limit", Json, nullable=False),  # {gpu_type: gpus}
    Column("weight", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # The uid (and gid) the tenant's jobs run as in their sandboxes; given on first use.
    Column("uid", Integer, nullable=True, unique=True),
    # Caps on the CPUs and memory (GB) its running jobs hold; NULL: none.
    Column("cpu_quota", Float, nullable=True),
    Column("memory_quota_gb", Float, nullable=True),
    # Datasets (migration 0012): bytes of shards the tenant may store (NULL: the server's
    # default), and its retention: keep the last N versions of a dataset, or those of D days.
    Column("data_quota_bytes", BigInteger, nullable=True),
    Column("data_keep_versions", Integer, nullable=True),
    Column("data_keep_days", Float, nullable=True),
)

users = Table(
    "users",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("cluster_admin", Boolean, nullable=False),
    Column("disabled", Boolean, nullable=False),
    Column("created_at", Float, nullable=False),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    # The id is the token's non-secret prefix: lookup by id, then compare hashes in constant time.
    Column("id", String(32), primary_key=True),
    Column(
        "user_name",
        String(128),
        ForeignKey("users.name", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("token_hash", String(64), nullable=False),  # SHA-256 hex of the whole token
    Column("description", String(200), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float),
    Column("revoked_at", Float),
    Column("last_used_at", Float),
)

role_bindings = Table(
    "role_bindings",
    metadata,
    Column(
        "user_name",
        String(128),
        ForeignKey("users.name", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column(
        "tenant",
        String(63),
        ForeignKey("tenants.name", ondelete="CASCADE"),
        primary_key=True,
        index=True,
    ),
    Column("role", String(16), nullable=False),
    CheckConstraint("role IN ('admin', 'member', 'viewer')", name="role"),
)

_JOB_STATES = "'PENDING', 'STARTING', 'RUNNING', 'PREEMPTING', 'RESTARTING', " + (
    "'SUCCEEDED', 'FAILED', 'CANCELLED'"
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("tenant", String(63), ForeignKey("tenants.name"), nullable=False),
    Column("name", String(63), nullable=False),
    Column("spec", Json, nullable=False),  # JobSpec.canonical_dict()
    Column("spec_hash", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("gpus", Integer, nullable=False),  # total, for listings and quota views
    Column("submitted_by", String(128), nullable=False),
    Column("submitted_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("placement", Json),
    # What the job keeps from its earlier runs (scheduler.Progress and when it was requeued):
    # written by the control loop when a run is interrupted (migration 0008).
    Column("progress", Json),
    # "batch" (submitted by a tenant) or "service" (a model deployment's replica, submitted by
    # the serving leader), and for a service its {"model", "version"} (migration 0010).
    Column("kind", String(16), nullable=False, server_default="batch"),
    Column("service", Json),
    Column("attempt", Integer, nullable=False),
    Column("restarts", Integer, nullable=False),
    Column("pending_code", String(32)),
    Column("pending_reason", String(1024)),
    Column("exit_code", Integer),
    Column("exit_message", Text),
    # How a FAILED job failed: its first failed rank and node, its exit code or signal, and its
    # stderr's last lines (core.failure.Failure.to_json; migration 0015).
    Column("failure", Json),
    Column("cancel_requested_at", Float),
    Column("idempotency_key", String(255)),
    Column("version", Integer, nullable=False),
    # NULL keys never collide (SQLite and PostgreSQL alike): jobs without a key are unconstrained.
    UniqueConstraint("tenant", "idempotency_key"),
    CheckConstraint(f"state IN ({_JOB_STATES})", name="state"),
    Index("ix_jobs_tenant_id", "tenant", "id"),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_kind_state", "kind", "state"),
)

events = Table(
    "events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("kind", String(64), nullable=False),
    # No foreign keys: the log outlives the rows it talks about. Triggers refuse UPDATE/DELETE.
    Column("tenant", String(63)),
    Column("job_id", String(32)),
    Column("from_state", String(16)),
    Column("to_state", String(16)),
    Column("details", Json, nullable=False),
    # The leader epoch of the control plane whose (fenced) write logged it; NULL for the API's.
    Column("epoch", BigInteger),
    Index("ix_events_job_id_id", "job_id", "id"),
    Index("ix_events_tenant_id", "tenant", "id"),
    # The audit log's filters (migration 0006).
    Index("ix_events_kind_id", "kind", "id"),
    Index("ix_events_actor_id", "actor", "id"),
    Index("ix_events_at", "at"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("rack", String(253), nullable=False),
    Column("pod", String(253), nullable=False),
    Column("gpu_type", String(63), nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("cpus", Float, nullable=False),
    Column("memory_gb", Float, nullable=False),
    Column("nvlink_domain_size", Integer, nullable=False),
    Column("labels", Json, nullable=False),
    Column("health", String(16), nullable=False),
    Column("health_reason", String(1024)),
    Column("last_seen", Float),
    Column("registered_at", Float, nullable=False),
    # Power saving (migration 0014): on, suspending, off, resuming or failed-to-resume (an idle
    # node is "on" here), and when a suspend or resume under way is expected done.
    Column("power", String(24), nullable=False, server_default="on"),
    Column("power_until", Float),
    CheckConstraint("health IN ('healthy', 'unhealthy', 'cordoned', 'draining')", name="health"),
)

model_versions = Table(
    "model_versions",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("tenant", String(63), ForeignKey("tenants.name"), nullable=False),
    Column("name", String(63), nullable=False),
    Column("version", Integer, nullable=False),  # 1, 2, ... per (tenant, name); immutable rows
    # Lineage. job_id has no foreign key: a model may be registered by hand from files.
    Column("job_id", String(32)),
    Column("spec_hash", String(64)),
    Column("code_version", String(64), nullable=False),  # SHA-256 of the code snapshot
    Column("dataset_hash", String(64)),
    Column("metrics", Json, nullable=False),  # final metrics, e.g. {"loss": 1.7}
    Column("registered_by", String(128), nullable=False),
    Column("registered_at", Float, nullable=False),
    Column("artifact", Text, nullable=False),  # directory, relative to the state directory
    Column("meta", Json, nullable=False),  # the artifact's model.json (entrypoint, config, drift)
    Column("parent", String(80)),  # NAME:VERSION it was trained from (migration 0013)
    UniqueConstraint("tenant", "name", "version"),
)

model_datasets = Table(
    "model_datasets",
    metadata,
    # The dataset versions a model version was trained on, copied at registration from its
    # job's recorded inputs with their manifests' hashes (migration 0013): lineage keeps them
    # after a dataset version is deleted.
    Column("tenant", String(63), primary_key=True),
    Column("model", String(63), primary_key=True),
    Column("model_version", Integer, primary_key=True),
    Column("dataset", String(63), primary_key=True),
    Column("dataset_version", Integer, nullable=False),
    Column("manifest_sha256", String(64)),
    Index(
        "ix_model_datasets_tenant_dataset_dataset_version", "tenant", "dataset", "dataset_version"
    ),
)

deployments = Table(
    "deployments",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("tenant", String(63), ForeignKey("tenants.name"), nullable=False),
    Column("name", String(63), nullable=False),  # the model name: /v1/models/<name>/predict
    # {"replicas": n} or {"autoscaling": {"min": a, "max": b, "target_ongoing_requests": t}},
    # either with {"gpus": g} per replica
    Column("scaling", Json, nullable=False),
    Column("traffic", Json, nullable=False),  # {"<version>": percent, ...}, summing to 100
    # What one replica (a service job) holds besides its GPUs (migration 0011).
    Column("cpus", Float, nullable=False, server_default="1"),
    Column("memory_gb", Float, nullable=False, server_default="1"),
    Column("state", String(16), nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("version", Integer, nullable=False),  # optimistic concurrency, as for jobs
    UniqueConstraint("tenant", "name"),
    CheckConstraint("state IN ('active', 'deleting', 'deleted')", name="state"),
)

rollouts = Table(
    "rollouts",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("tenant", String(63), ForeignKey("tenants.name"), nullable=False),
    Column("name", String(63), nullable=False),
    Column("from_version", Integer, nullable=False),
    Column("to_version", Integer, nullable=False),
    Column("steps", Json, nullable=False),  # canary weights in percent, e.g. [10, 25, 50, 100]
    Column("step_index", Integer, nullable=False),
    Column("interval_s", Float, nullable=False),
    Column("max_error_rate", Float, nullable=False),  # a fraction: 0.01 is 1%
    Column("max_p99_ms", Float, nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", String(1024)),
    Column("step_started_at", Float, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    CheckConstraint("state IN ('running', 'promoted', 'rolled_back', 'aborted')", name="state"),
    Index("ix_rollouts_tenant_name", "tenant", "name"),
)

pipelines = Table(
    "pipelines",
    metadata,
    # A continuous-learning pipeline (migration 0013): its spec, whether it is paused, and its
    # trigger evaluator's memory (dataset versions seen, last run, drift since).
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("tenant", String(63), ForeignKey("tenants.name"), nullable=False),
    Column("name", String(63), nullable=False),
    Column("spec", Json, nullable=False),
    Column("paused", Boolean, nullable=False),
    Column("memory", Json, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("tenant", "name"),
)

pipeline_runs = Table(
    "pipeline_runs",
    metadata,
    # One retraining of a pipeline: training -> rolling_out -> promoted | rolled_back, or failed.
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("pipeline_id", BigId, ForeignKey("pipelines.id", ondelete="CASCADE"), nullable=False),
    Column("tenant", String(63), nullable=False),
    Column("state", String(16), nullable=False),
    Column("reasons", Json, nullable=False),  # the triggers that fired it
    Column("job_id", String(32)),
    Column("model_version", Integer),
    Column("rollout_id", BigInteger),
    Column("detail", String(1024)),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Index("ix_pipeline_runs_pipeline_id", "pipeline_id"),
)

leases = Table(
    "leases",
    metadata,
    # One row per role ("control"): who leads, since which takeover, and its renewals.
    Column("name", String(63), primary_key=True),
    Column("holder", String(255), nullable=False),  # "" once released
    Column("epoch", BigInteger, nullable=False),  # +1 on every takeover: the fencing token
    Column("renewals", BigInteger, nullable=False),  # +1 on every renewal (what standbys watch)
    Column("acquired_at", Float, nullable=False),  # the holder's wall clock: for people only
    Column("renewed_at", Float, nullable=False),
)

configs = Table(
    "configs",
    metadata,
    # Every scheduler configuration applied, in order; the newest is the live one.
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("text", Text, nullable=False),  # the YAML as applied (validated before it is stored)
    Column("sha256", String(64), nullable=False),
    Column("source", String(255), nullable=False),  # the file name it was applied from
    Column("applied_by", String(128), nullable=False),
    Column("applied_at", Float, nullable=False),
)

dataset_versions = Table(
    "dataset_versions",
    metadata,
    # One immutable version of a tenant's dataset (migration 0012); its shards live in the
    # data store under the tenant's prefix, named by their SHA-256.
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("tenant", String(63), ForeignKey("tenants.name"), nullable=False),
    Column("name", String(63), nullable=False),
    Column("version", Integer, nullable=False),  # 1, 2, ... per (tenant, name)
    Column("manifest_sha256", String(64), nullable=False),
    Column("manifest", Json, nullable=False),  # {"format": 1, "files": [...], "shards": [...]}
    Column("bytes", BigInteger, nullable=False),  # of its files
    Column("files", Integer, nullable=False),
    Column("pushed_by", String(128), nullable=False),
    Column("pushed_at", Float, nullable=False),
    UniqueConstraint("tenant", "name", "version"),
)

job_datasets = Table(
    "job_datasets",
    metadata,
    # The dataset versions a job reads, resolved at submit (migration 0012): what ``data rm``
    # checks and what lineage names.
    Column("job_id", String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("name", String(63), primary_key=True),
    Column("tenant", String(63), nullable=False),
    Column("version", Integer, nullable=False),
    Index("ix_job_datasets_tenant_name_version", "tenant", "name", "version"),
)
