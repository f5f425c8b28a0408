"""Real databases for the store's integration tests: SQLite in a temporary directory, and a
PostgreSQL database created for this test session (each test in a schema of its own).

PostgreSQL is found at ``AICLUSTER_TEST_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/
postgres``, a server's maintenance database). A session creates ``aicluster_test_<pid>_<random>``
and drops it at the end, so parallel sessions and other projects on the same server never see
each other. Unreachable server: the PostgreSQL cases skip locally and FAIL under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import clusterstate
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from aicluster.core import ManualClock
from aicluster.store import Store

PG_URL = os.environ.get("AICLUSTER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ["sqlite", "postgresql"]


def _admin_engine():  # type: ignore[no-untyped-def]
    url = make_url(PG_URL).set(drivername="postgresql+psycopg")
    return create_engine(
        url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}, pool_size=1
    )


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """URL of a PostgreSQL database that lives as long as this test session."""
    admin = _admin_engine()
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:
        admin.dispose()
        message = f"PostgreSQL is not reachable at {PG_URL}: {error}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message + " (set AICLUSTER_TEST_PG_URL; required when CI=true)")
    name = f"aicluster_test_{os.getpid()}_{secrets.token_hex(4)}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield (
            make_url(PG_URL)
            .set(drivername="postgresql+psycopg", database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fresh, empty store location: a state directory, or a schema of the session database."""
    with _store_location(request, tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module", params=BACKENDS)
def module_store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """As ``store_url``, shared by one module's tests (e.g. an API server started once)."""
    with _store_location(request, tmp_path_factory) as url:
        yield url


@contextmanager
def _store_location(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path_factory.mktemp("state"))
        return
    database = request.getfixturevalue("pg_database")
    schema = f"t_{secrets.token_hex(6)}"
    engine = create_engine(database, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = make_url(database).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.connect() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000.0)


@pytest.fixture
def store(store_url: str, clock: ManualClock) -> Iterator[Store]:
    opened = Store.open(store_url, clock=clock)
    try:
        yield opened
    finally:
        opened.close()


# -- a real multi-node Ray cluster on 127.0.0.1, shared by the runtime and control tests ---------

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """Four Ray nodes (node-0..node-3, 2 racks, 8 simulated GPUs, 8 CPUs each), connected."""
    from aicluster.runtime import EmbeddedCluster, embedded_topology

    cluster = EmbeddedCluster(embedded_topology(nodes=4, gpus_per_node=8))
    cluster.start()
    cluster.connect()
    try:
        yield cluster
    finally:
        cluster.shutdown()


#: The warm log directories of the session's own runtimes, whose warm starters stay up.
_SESSION_WARM_DIRS: set[str] = set()


@pytest.fixture(scope="session")
def runtime(ray_cluster: object, tmp_path_factory: pytest.TempPathFactory) -> object:
    from aicluster.runtime import Runtime
    from aicluster.runtime.warm.starter import log_dir

    made = Runtime(tmp_path_factory.mktemp("state"), start_timeout_s=60)
    _SESSION_WARM_DIRS.add(log_dir(made.state_dir))
    return made


@pytest.fixture(scope="module", autouse=True)
def _release_what_the_modules_servers_left() -> Iterator[None]:
    """After each module, stop what its servers left on the session's Ray cluster and nobody
    will use again: each server's tenants' warm starters (detached actors named after the
    server's own state directory; with their warm processes, about 1% of a core each) and Ray
    Serve's controller (about 4% of a core, idle). Set up first, so torn down last: after the
    module's servers stopped. The session runtime's own starters stay."""
    yield
    import ray

    if not ray.is_initialized():
        return
    from ray.util import list_named_actors

    from aicluster.runtime.warm.starter import scope_digest

    keep = {scope_digest(scope) for scope in _SESSION_WARM_DIRS}
    for entry in list_named_actors(all_namespaces=True):
        name, namespace = str(entry["name"]), str(entry["namespace"])
        if name.startswith("aicluster-warm/") and name.count("/") == 2:
            if "/~~" in name or name.rsplit(".", 1)[-1] in keep:
                continue  # a digest names no scope: kept, lest it be the session's own
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=namespace))
        elif name == "SERVE_CONTROLLER_ACTOR":
            from ray import serve

            serve.shutdown()
    still_held = clusterstate.release_leftovers()
    if still_held:  # shown with the next failure of this worker's log, not a failure itself
        print(f"after the module, the cluster still holds: {still_held}")
