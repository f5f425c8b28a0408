"""A job spec without ``resources.gpus`` holds no GPU (it held one before): stored specs are
kept without the fields at their defaults (``JobSpec.canonical_dict``), so every stored job
spec, and every pipeline's job, that relied on the implicit GPU gets ``gpus: 1`` written out,
and reads back as the job it was.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | None = None
depends_on: str | None = None


def _explicit(spec: Any) -> Any:
    """``spec`` with ``resources.gpus: 1`` when it gives no GPU count; None if unchanged."""
    if not isinstance(spec, dict):
        return None
    resources = spec.get("resources")
    if isinstance(resources, dict) and "gpus" in resources:
        return None
    return {**spec, "resources": {**(resources or {}), "gpus": 1}}


def _rewrite(table: str, job_of: Any, put: Any) -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    rows = sa.table(table, sa.column("id"), sa.column("spec", json))
    bind = op.get_bind()
    for row in bind.execute(sa.select(rows.c.id, rows.c.spec)).all():
        changed = _explicit(job_of(row.spec))
        if changed is not None:
            spec = put(row.spec, changed)
            bind.execute(sa.update(rows).where(rows.c.id == row.id).values(spec=spec))


def upgrade() -> None:
    _rewrite("jobs", lambda spec: spec, lambda _, job: job)
    _rewrite(
        "pipelines",
        lambda spec: spec.get("job") if isinstance(spec, dict) else None,
        lambda spec, job: {**spec, "job": job},
    )


def downgrade() -> None:
    """Nothing to undo: ``gpus: 1`` written out means what the older code read by default."""
