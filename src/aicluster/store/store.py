"""The store: one object over the database, opened from a state directory or a URL."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

from sqlalchemy import Engine

from aicluster.core import Clock
from aicluster.store.auth import AuthOps
from aicluster.store.base import WallClock
from aicluster.store.cluster import ClusterOps
from aicluster.store.configs import ConfigOps
from aicluster.store.datasets import DatasetOps
from aicluster.store.engine import make_engine, migrate, resolve_url
from aicluster.store.fencing import Fence
from aicluster.store.jobs import JobOps
from aicluster.store.lineage import LineageOps
from aicluster.store.models import ModelOps
from aicluster.store.pipelines import PipelineOps
from aicluster.store.rollouts import RolloutOps
from aicluster.store.serving import ServingOps
from aicluster.store.stats import StatsOps
from aicluster.store.submit import SubmitOps
from aicluster.store.usage import UsageOps

__all__ = ["Store"]


class Store(
    SubmitOps,
    JobOps,
    AuthOps,
    ClusterOps,
    ConfigOps,
    StatsOps,
    ModelOps,
    ServingOps,
    RolloutOps,
    DatasetOps,
    LineageOps,
    PipelineOps,
    UsageOps,
):
    """Durable state of the control plane: jobs, the event log, tenants, users, tokens, nodes,
    the model registry, deployments, canary rollouts, the scheduler configurations applied
    and datasets.

    Every public method is one transaction and returns only after it has committed; every state
    change appends to the event log in the same transaction. Thread-safe (a connection pool);
    several processes may share a PostgreSQL database, and may share a SQLite file for reading
    and for occasional writes (one control plane writes: see :mod:`aicluster.store.leader`).
    """

    def __init__(self, engine: Engine, clock: Clock, state_dir: Path | None) -> None:
        """Use :meth:`open`; this wraps an engine whose schema is already at head."""
        super().__init__(engine, clock, state_dir)
        self._init_submit()

    @classmethod
    def open(
        cls,
        url_or_state_dir: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        upgrade: bool = True,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> Store:
        """Open (and by default migrate to head) the store at a state directory or a URL.

        A path means SQLite in ``<path>/aicluster.db`` (the directory is created); URLs may be
        ``sqlite:///...`` or ``postgresql://...``. A SQLite store keeps its files (file locks, the
        model registry's artifacts) next to its database; a PostgreSQL store keeps them in
        ``state_dir``, which the registry needs (the server passes ``--state-dir``). Migrating
        is idempotent and safe from several processes at once. Raises ``ValueError`` for other
        databases and SQLAlchemy's ``OperationalError`` when the database cannot be reached.
        """
        url, db_dir = resolve_url(url_or_state_dir)
        files = db_dir or (Path(state_dir).expanduser().resolve() if state_dir else None)
        engine = make_engine(url)
        try:
            if upgrade:
                migrate(engine)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, clock or WallClock(), files)

    def fenced(self, fence: Fence) -> Store:
        """See :meth:`StoreBase.fenced`; the view batches its own submissions (SQLite's group
        commit), so fenced and unfenced writes never share a transaction."""
        view = super().fenced(fence)
        view._init_submit()
        return view

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return self.engine.url.render_as_string(hide_password=True)

    def close(self) -> None:
        """Close every pooled connection. Idempotent."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
