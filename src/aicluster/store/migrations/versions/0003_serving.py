"""Serving: the model registry, deployments and canary rollouts.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _tenant() -> sa.Column[str]:
    return sa.Column("tenant", sa.String(63), sa.ForeignKey("tenants.name"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(32)),
        sa.Column("spec_hash", sa.String(64)),
        sa.Column("code_version", sa.String(64), nullable=False),
        sa.Column("dataset_hash", sa.String(64)),
        sa.Column("metrics", _JSON, nullable=False),
        sa.Column("registered_by", sa.String(128), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.Column("artifact", sa.Text(), nullable=False),
        sa.Column("meta", _JSON, nullable=False),
        sa.UniqueConstraint("tenant", "name", "version"),
    )
    op.create_table(
        "deployments",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("scaling", _JSON, nullable=False),
        sa.Column("traffic", _JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.UniqueConstraint("tenant", "name"),
        sa.CheckConstraint("state IN ('active', 'deleting', 'deleted')", name="state"),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", _BIG_ID, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("from_version", sa.Integer(), nullable=False),
        sa.Column("to_version", sa.Integer(), nullable=False),
        sa.Column("steps", _JSON, nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("max_error_rate", sa.Float(), nullable=False),
        sa.Column("max_p99_ms", sa.Float(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(1024)),
        sa.Column("step_started_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.CheckConstraint(
            "state IN ('running', 'promoted', 'rolled_back', 'aborted')", name="state"
        ),
        sa.Index("ix_rollouts_tenant_name", "tenant", "name"),
    )


def downgrade() -> None:
    op.drop_table("rollouts")
    op.drop_table("deployments")
    op.drop_table("model_versions")
