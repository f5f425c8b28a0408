"""Alembic environment: migrations run on the connection :func:`aicluster.store.migrate` passes.

To write a new revision, point Alembic at a scratch database, for example::

    from alembic import command
    from alembic.config import Config
    config = Config()
    config.set_main_option("script_location", "src/aicluster/store/migrations")
    config.set_main_option("sqlalchemy.url", "sqlite:////tmp/scratch.db")
    command.upgrade(config, "head")
    command.revision(config, "add models table", autogenerate=True, rev_id="0002")

Later features (model registry, deployments, checkpoints, telemetry) add their own tables in new
revisions; never edit a revision that has shipped.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from aicluster.store.schema import metadata

config = context.config
connection = config.attributes.get("connection")
if connection is None:  # the developer path above: a URL instead of a live connection
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("run migrations through aicluster.store.migrate() or set sqlalchemy.url")
    with create_engine(url).begin() as own_connection:
        context.configure(connection=own_connection, target_metadata=metadata)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
