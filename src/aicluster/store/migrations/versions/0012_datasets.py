"""Datasets: immutable versions per tenant (shards in the data store), the versions each job
reads, and each tenant's data quota and retention.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.add_column("tenants", sa.Column("data_quota_bytes", sa.BigInteger(), nullable=True))
    op.add_column("tenants", sa.Column("data_keep_versions", sa.Integer(), nullable=True))
    op.add_column("tenants", sa.Column("data_keep_days", sa.Float(), nullable=True))
    op.create_table(
        "dataset_versions",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(63), sa.ForeignKey("tenants.name"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("manifest", json, nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("pushed_by", sa.String(128), nullable=False),
        sa.Column("pushed_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant", "name", "version"),
    )
    op.create_table(
        "job_datasets",
        sa.Column(
            "job_id",
            sa.String(32),
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    op.create_index(
        "ix_job_datasets_tenant_name_version", "job_datasets", ["tenant", "name", "version"]
    )


def downgrade() -> None:
    op.drop_index("ix_job_datasets_tenant_name_version", table_name="job_datasets")
    op.drop_table("job_datasets")
    op.drop_table("dataset_versions")
    op.drop_column("tenants", "data_keep_days")
    op.drop_column("tenants", "data_keep_versions")
    op.drop_column("tenants", "data_quota_bytes")
