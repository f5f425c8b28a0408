"""Nodes may be draining: unschedulable, and their jobs are moved elsewhere.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # SQLite cannot alter a CHECK constraint in place: batch mode recreates the table.
    with op.batch_alter_table("nodes", recreate="always") as batch:
        batch.drop_constraint("ck_nodes_health", type_="check")
        batch.create_check_constraint(
            "ck_nodes_health", "health IN ('healthy', 'unhealthy', 'cordoned', 'draining')"
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes", recreate="always") as batch:
        batch.drop_constraint("ck_nodes_health", type_="check")
        batch.create_check_constraint(
            "ck_nodes_health", "health IN ('healthy', 'unhealthy', 'cordoned')"
        )
