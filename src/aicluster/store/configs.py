"""The scheduler configurations applied: an append-only history whose newest row is live.

The text is stored as applied (comments and all), after the caller validated it
(:func:`aicluster.configuration.parse_configuration`); the leader's control loop notices a new
row at its next tick (:meth:`ConfigOps.current_config_id`, one indexed read).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, func, insert, select

from aicluster.store import schema
from aicluster.store.base import StoreBase

__all__ = ["ConfigOps", "ConfigRecord"]

configs = schema.configs


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    id: int
    text: str
    sha256: str
    source: str
    applied_by: str
    applied_at: float


class ConfigOps(StoreBase):
    def apply_config(self, text: str, source: str, actor: str) -> ConfigRecord:
        """Record ``text`` as the live configuration and log ``config.applied``. Applying the
        text that is live already changes nothing (and logs nothing)."""
        digest = hashlib.sha256(text.encode()).hexdigest()
        with self._write() as connection:
            row = connection.execute(select(configs).order_by(configs.c.id.desc()).limit(1)).first()
            if row is not None and row.sha256 == digest:
                return _record(row)
            now, source = self._now(), source[:255]
            inserted = connection.execute(
                insert(configs).values(
                    text=text, sha256=digest, source=source, applied_by=actor, applied_at=now
                )
            )
            new_id = int(inserted.inserted_primary_key[0])  # type: ignore[index]
            details = {"config_id": new_id, "sha256": digest, "source": source}
            self._log(connection, actor=actor, kind="config.applied", details=details)
        return ConfigRecord(new_id, text, digest, source, actor, now)

    def current_config(self) -> ConfigRecord | None:
        """The live configuration; None until one is applied (the defaults are live then)."""
        with self._read() as connection:
            row = connection.execute(select(configs).order_by(configs.c.id.desc()).limit(1)).first()
        return None if row is None else _record(row)

    def current_config_id(self) -> int:
        """The live configuration's id (0: none applied)."""
        with self._read() as connection:
            return int(connection.execute(select(func.max(configs.c.id))).scalar() or 0)


def _record(row: Row[Any]) -> ConfigRecord:
    return ConfigRecord(
        id=int(row.id),
        text=str(row.text),
        sha256=str(row.sha256),
        source=str(row.source),
        applied_by=str(row.applied_by),
        applied_at=float(row.applied_at),
    )
