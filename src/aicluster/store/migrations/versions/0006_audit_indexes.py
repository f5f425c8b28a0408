"""Indexes for the audit log's filters: by kind (an action or a prefix such as ``job.``), by
actor, and by time.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # Plain CREATE INDEX: the append-only triggers on ``events`` stay as they are.
    op.create_index("ix_events_kind_id", "events", ["kind", "id"])
    op.create_index("ix_events_actor_id", "events", ["actor", "id"])
    op.create_index("ix_events_at", "events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_events_at", table_name="events")
    op.drop_index("ix_events_actor_id", table_name="events")
    op.drop_index("ix_events_kind_id", table_name="events")
