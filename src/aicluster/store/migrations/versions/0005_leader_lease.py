"""Leadership is a lease row with an epoch (the fencing token); events record the writer's epoch.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("renewals", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("renewed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_leases"),
    )
    # A plain ADD COLUMN (no batch): recreating ``events`` on SQLite would drop its
    # append-only triggers.
    op.add_column("events", sa.Column("epoch", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # SQLite >= 3.35 drops a column in place, without recreating the table (and its triggers).
    op.drop_column("events", "epoch")
    op.drop_table("leases")
