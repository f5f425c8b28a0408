"""Each tenant gets its own unprivileged uid, the one its jobs' sandboxes run as on every node.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(sa.Column("uid", sa.Integer(), nullable=True))
        batch.create_unique_constraint("uq_tenants_uid", ["uid"])


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_constraint("uq_tenants_uid", type_="unique")
        batch.drop_column("uid")
