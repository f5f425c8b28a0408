"""A job keeps the progress of its earlier runs (attained service, executed time) in the store,
so that a preempted or restarted job comes back to the queue with it, also after a failover.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    op.add_column("jobs", sa.Column("progress", json, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "progress")
