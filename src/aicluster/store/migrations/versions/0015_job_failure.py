"""A FAILED job keeps how it failed (``aicluster.core.failure``): its first failed rank and node,
its exit code or signal, and the last lines of its stderr, for the API, ``aicluster jobs`` and
``why`` and the dashboard.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    op.add_column("jobs", sa.Column("failure", json, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "failure")
