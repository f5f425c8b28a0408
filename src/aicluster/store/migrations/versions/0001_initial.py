"""Initial schema: tenants, users, tokens, role bindings, jobs, the event log and nodes.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

A revision is a frozen snapshot: it does not import ``aicluster.store.schema``, which moves on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_STATES = (
    "'PENDING', 'STARTING', 'RUNNING', 'PREEMPTING', 'RESTARTING', "
    "'SUCCEEDED', 'FAILED', 'CANCELLED'"
)


def upgrade() -> None:
    _identity_tables()
    _job_tables()
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("rack", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("gpu_type", sa.String(63), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("cpus", sa.Float(), nullable=False),
        sa.Column("memory_gb", sa.Float(), nullable=False),
        sa.Column("nvlink_domain_size", sa.Integer(), nullable=False),
        sa.Column("labels", _JSON, nullable=False),
        sa.Column("health", sa.String(16), nullable=False),
        sa.Column("health_reason", sa.String(1024)),
        sa.Column("last_seen", sa.Float()),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_nodes"),
        sa.CheckConstraint(
            "health IN ('healthy', 'unhealthy', 'cordoned')", name="ck_nodes_health"
        ),
    )
    _append_only_events()


def _identity_tables() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("quota", _JSON, nullable=False),
        sa.Column("borrow_limit", _JSON, nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_tenants"),
    )
    op.create_table(
        "users",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("cluster_admin", sa.Boolean(), nullable=False),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_users"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("description", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float()),
        sa.Column("revoked_at", sa.Float()),
        sa.Column("last_used_at", sa.Float()),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.ForeignKeyConstraint(
            ["user_name"],
            ["users.name"],
            name="fk_api_tokens_user_name_users",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_api_tokens_user_name", "api_tokens", ["user_name"])
    op.create_table(
        "role_bindings",
        sa.Column("user_name", sa.String(128), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("user_name", "tenant", name="pk_role_bindings"),
        sa.ForeignKeyConstraint(
            ["user_name"],
            ["users.name"],
            name="fk_role_bindings_user_name_users",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant"],
            ["tenants.name"],
            name="fk_role_bindings_tenant_tenants",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("role IN ('admin', 'member', 'viewer')", name="ck_role_bindings_role"),
    )
    op.create_index("ix_role_bindings_tenant", "role_bindings", ["tenant"])


def _job_tables() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", _JSON, nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("submitted_by", sa.String(128), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("placement", _JSON),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("pending_code", sa.String(32)),
        sa.Column("pending_reason", sa.String(1024)),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("exit_message", sa.Text()),
        sa.Column("cancel_requested_at", sa.Float()),
        sa.Column("idempotency_key", sa.String(255)),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"], name="fk_jobs_tenant_tenants"),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
        sa.CheckConstraint(f"state IN ({_STATES})", name="ck_jobs_state"),
    )
    op.create_index("ix_jobs_tenant_id", "jobs", ["tenant", "id"])
    op.create_index("ix_jobs_state", "jobs", ["state"])
    op.create_table(
        "events",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(63)),
        sa.Column("job_id", sa.String(32)),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16)),
        sa.Column("details", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])
    op.create_index("ix_events_tenant_id", "events", ["tenant", "id"])


def _append_only_events() -> None:
    """The log refuses UPDATE and DELETE (and TRUNCATE on PostgreSQL) from any client."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION aicluster_events_append_only() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'events are append-only'; END $$"
        )
        op.execute(
            "CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events "
            "FOR EACH ROW EXECUTE FUNCTION aicluster_events_append_only()"
        )
        op.execute(
            "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
            "FOR EACH STATEMENT EXECUTE FUNCTION aicluster_events_append_only()"
        )
        return
    for action in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER events_no_{action.lower()} BEFORE {action} ON events "
            "BEGIN SELECT RAISE(ABORT, 'events are append-only'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION aicluster_events_append_only() CASCADE")
    for table in ("events", "jobs", "role_bindings", "api_tokens", "users", "tenants", "nodes"):
        op.drop_table(table)
