"""Jobs have a kind: ``batch`` (what a tenant submits) or ``service`` (a replica of a model
deployment, submitted by the serving leader); a service job names its deployment's model and
version, so the serving side can count and run one Serve replica per running one.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    op.add_column("jobs", sa.Column("kind", sa.String(16), nullable=False, server_default="batch"))
    op.add_column("jobs", sa.Column("service", json, nullable=True))
    op.create_index("ix_jobs_kind_state", "jobs", ["kind", "state"])


def downgrade() -> None:
    op.drop_index("ix_jobs_kind_state", table_name="jobs")
    op.drop_column("jobs", "service")
    op.drop_column("jobs", "kind")
