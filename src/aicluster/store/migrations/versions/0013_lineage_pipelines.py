"""Lineage and continuous learning: the dataset versions (with their manifests' hashes) each
model version was trained on, a version's parent model, and pipelines with their runs.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.add_column("model_versions", sa.Column("parent", sa.String(80), nullable=True))
    op.create_table(
        "model_datasets",
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("model", sa.String(63), nullable=False),
        sa.Column("model_version", sa.Integer(), nullable=False),
        sa.Column("dataset", sa.String(63), nullable=False),
        sa.Column("dataset_version", sa.Integer(), nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=True),
        sa.PrimaryKeyConstraint("tenant", "model", "model_version", "dataset"),
    )
    op.create_index(
        "ix_model_datasets_tenant_dataset_dataset_version",
        "model_datasets",
        ["tenant", "dataset", "dataset_version"],
    )
    op.create_table(
        "pipelines",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.String(63), sa.ForeignKey("tenants.name"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", json, nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("memory", json, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("tenant", "name"),
    )
    op.create_table(
        "pipeline_runs",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column(
            "pipeline_id",
            big_id,
            sa.ForeignKey("pipelines.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reasons", json, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("model_version", sa.Integer(), nullable=True),
        sa.Column("rollout_id", sa.BigInteger(), nullable=True),
        sa.Column("detail", sa.String(1024), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
    )
    op.create_index("ix_pipeline_runs_pipeline_id", "pipeline_runs", ["pipeline_id"])


def downgrade() -> None:
    op.drop_index("ix_pipeline_runs_pipeline_id", table_name="pipeline_runs")
    op.drop_table("pipeline_runs")
    op.drop_table("pipelines")
    op.drop_index("ix_model_datasets_tenant_dataset_dataset_version", table_name="model_datasets")
    op.drop_table("model_datasets")
    op.drop_column("model_versions", "parent")
