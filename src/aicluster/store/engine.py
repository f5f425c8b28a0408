"""Engines for SQLite (the default, in a state directory) and PostgreSQL, and migrations.

SQLite: WAL journal (readers never block the writer), ``synchronous=FULL`` (a commit is on disk
before it returns, so an acknowledged submission survives power loss), foreign keys on, and a
busy timeout. Write transactions start with ``BEGIN IMMEDIATE``: they take the write lock up
front, so two writers queue on the busy timeout instead of failing with "database is locked"
when a read lock cannot be upgraded. Read transactions start with a plain ``BEGIN``.

PostgreSQL: ``postgresql://`` URLs use psycopg 3. Write transactions run at READ COMMITTED and
lock the rows they change (``SELECT ... FOR UPDATE``). Every session sets
``idle_in_transaction_session_timeout``: a process frozen in the middle of a transaction (a
SIGSTOP, a long pause) would otherwise hold its row locks, the leader lease's among them, for as
long as its kernel answers TCP keepalives; the server ends such a session after
``IDLE_IN_TRANSACTION_S`` instead (see :mod:`aicluster.store.leader`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url

from aicluster.artifacts.private import private_dir, private_file

__all__ = ["DB_FILE", "WRITE", "make_engine", "migrate", "resolve_url"]

#: The database file inside a state directory.
DB_FILE = "aicluster.db"
#: Execution option that marks a connection as a writer (``BEGIN IMMEDIATE`` on SQLite).
WRITE = "aicluster_write"
_BUSY_TIMEOUT_MS = 30_000
#: Seconds a PostgreSQL session may sit idle inside a transaction before the server ends it.
IDLE_IN_TRANSACTION_S = 10
_MIGRATIONS = Path(__file__).parent / "migrations"


def resolve_url(url_or_state_dir: str | os.PathLike[str]) -> tuple[URL, Path | None]:
    """The database URL and the state directory (for file locks), from either.

    A plain path is a state directory (created if missing) holding ``aicluster.db``. Bare
    ``postgresql://`` and ``postgres://`` URLs get the psycopg 3 driver. Raises ``ValueError``
    for other databases and for in-memory SQLite.
    """
    raw = os.fspath(url_or_state_dir)
    if "://" not in raw:
        state_dir = Path(raw).expanduser().resolve()
        private_file(private_dir(state_dir) / DB_FILE)
        return make_url(f"sqlite:///{state_dir / DB_FILE}"), state_dir
    url = make_url(raw)
    backend = url.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return url.set(drivername="postgresql+psycopg"), None
    if backend != "sqlite":
        raise ValueError(f"unsupported database {backend!r} (use SQLite or PostgreSQL)")
    database = url.database or ""
    if not database or database == ":memory:":
        # Every pooled connection would get a database of its own: use a temporary directory.
        raise ValueError("an in-memory SQLite store is not supported; give a state directory")
    path = Path(database).resolve()
    if path.parent.is_dir():  # else SQLite says what is missing
        private_file(path)
    return url, path.parent


def make_engine(url: URL) -> Engine:
    """An engine configured as the module docstring says. Does not touch the database yet."""
    if url.get_backend_name() == "sqlite":
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": _BUSY_TIMEOUT_MS / 1000},
            pool_size=8,
            max_overflow=24,
        )
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    engine = create_engine(url, pool_size=8, max_overflow=24, pool_pre_ping=True)
    event.listen(engine, "connect", _postgres_connect)
    return engine


def _postgres_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_S * 1000}")
    cursor.close()
    dbapi_connection.commit()  # the driver opened a transaction for the SET: keep the setting


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Autocommit at the driver level: pysqlite's own implicit BEGIN is not IMMEDIATE and it
    # commits before DDL; _sqlite_begin issues the BEGIN instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    for pragma in (
        "journal_mode=WAL",
        "synchronous=FULL",
        "foreign_keys=ON",
        f"busy_timeout={_BUSY_TIMEOUT_MS}",
    ):
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    immediate = connection.get_execution_options().get(WRITE, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def head_revision() -> str:
    """The newest migration shipped with this version of aicluster."""
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def migrate(engine: Engine) -> None:
    """Upgrade the schema to the newest migration (``alembic upgrade head``) in one transaction.

    Idempotent; safe from several processes at once: on PostgreSQL a transaction-scoped advisory
    lock serializes migrators, on SQLite the write lock of ``BEGIN IMMEDIATE`` does. Whoever
    comes second finds the schema at head and does nothing.
    """
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    with engine.execution_options(**{WRITE: True}).begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended('aicluster.migrate', 0))")
            )
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
