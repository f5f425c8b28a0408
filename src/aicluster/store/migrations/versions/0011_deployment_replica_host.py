"""Every deployment's replicas are service jobs: a deployment states the CPUs and memory one
replica holds (placed and capped by the scheduler as a job's are). Existing deployments get
the defaults, 1 CPU and 1 GB per replica.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("deployments", sa.Column("cpus", sa.Float(), nullable=False, server_default="1"))
    op.add_column(
        "deployments", sa.Column("memory_gb", sa.Float(), nullable=False, server_default="1")
    )


def downgrade() -> None:
    op.drop_column("deployments", "memory_gb")
    op.drop_column("deployments", "cpus")
