"""The scheduler configurations applied (``aicluster config apply``), newest live.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "configs",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("source", sa.String(255), nullable=False),
        sa.Column("applied_by", sa.String(128), nullable=False),
        sa.Column("applied_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_configs"),
    )


def downgrade() -> None:
    op.drop_table("configs")
