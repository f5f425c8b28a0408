"""A tenant may cap the CPUs and memory its running jobs hold (CPUs and memory are placed).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("tenants", sa.Column("cpu_quota", sa.Float(), nullable=True))
    op.add_column("tenants", sa.Column("memory_quota_gb", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("tenants", "memory_quota_gb")
    op.drop_column("tenants", "cpu_quota")
