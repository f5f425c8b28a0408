"""Nodes have a power state (power saving, ``aicluster.control.loop.power``): the live loop keeps it
here so that a rebuilt state, or a new leader, knows which nodes are off or coming back.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("power", sa.String(24), nullable=False, server_default="on"))
        batch.add_column(sa.Column("power_until", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("power_until")
        batch.drop_column("power")
