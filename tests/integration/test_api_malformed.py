"""Malformed requests that once got a 500 (found by Schemathesis and by hand, mostly on
PostgreSQL, which refuses NUL in text): each is now a readable 4xx, on both stores, and the
server keeps serving the same connection."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from apiserver import RunningServer, open_plane, serve, serve_tenants
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from aicluster.core import Node, Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

SPEC = {"name": "x", "tenant": "a", "module": "t"}


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with serve_tenants(
        module_store_url,
        tmp_path_factory.mktemp("state"),
        [Tenant("a", quota={"H100": 8})],
        {"alice": ("a", Role.MEMBER)},
        [Node("node-0", 8, "H100", "rack-0", "pod-0")],
    ) as running:
        yield running


def _spec(**changes: Any) -> dict[str, Any]:
    return {"json": SPEC | changes}


MALFORMED: list[tuple[str, str, dict[str, Any], int]] = [
    # NUL in path and query parameters reached PostgreSQL: psycopg.DataError, a 500.
    ("GET", "/v1/jobs/j-%00x", {}, 422),
    ("GET", "/v1/jobs?cursor=%00", {}, 422),
    ("GET", "/v1/jobs?tenant=a%00", {}, 422),
    ("GET", "/v1/queue?tenant=a%00", {}, 422),
    ("DELETE", "/v1/tenants/%00", {}, 422),
    ("DELETE", "/v1/tokens/%00", {}, 422),
    ("POST", "/v1/nodes/%00/cordon", {}, 422),
    ("POST", "/v1/nodes/node-0/cordon?reason=%00", {}, 422),  # found by Schemathesis
    ("PUT", "/v1/tenants/a%00/members", {"json": {"user": "alice", "role": "member"}}, 422),
    # ... and in bodies; a lone surrogate is text PostgreSQL's JSONB (and UTF-8) cannot hold.
    ("PUT", "/v1/tenants/a/members", {"json": {"user": "al\x00ice", "role": "member"}}, 422),
    ("PUT", "/v1/tenants/c", {"json": {"name": "c", "quota": {"H1\x0000": 1}}}, 422),
    ("PUT", "/v1/tenants/c", {"content": '{"name": "c", "quota": {"\\ud800": 1}}'}, 422),
    ("POST", "/v1/tokens", {"json": {"description": "x\x00y"}}, 422),
    ("POST", "/v1/tokens", {"json": {"user": "no\x00body"}}, 422),
    ("POST", "/v1/users", {"json": {"name": "\x00"}}, 422),
    ("POST", "/v1/jobs", _spec(args=["a\x00b"]), 422),
    ("POST", "/v1/jobs", _spec(env={"A": "a\x00b"}), 422),
    # Deep nesting exhausted the stack while parsing the spec: RecursionError, a 500.
    ("POST", "/v1/jobs", {"content": "- " * 5000}, 422),
    ("POST", "/v1/jobs", {"content": "[" * 100_000}, 422),
    ("POST", "/v1/jobs", {"content": '{"a":' * 5000 + "1" + "}" * 5000}, 422),
    # A 5,000-digit integer was a bare ValueError from the YAML loader (a 400 without a field).
    (
        "POST",
        "/v1/jobs",
        {"content": "name: x\ntenant: a\nmodule: t\npriority: " + "9" * 5000},
        422,
    ),
    # A log offset past 2**63 raised OverflowError in seek().
    ("GET", "/v1/jobs/j-x/logs?offset=18446744073709551616", {}, 422),
]


@pytest.mark.parametrize(
    ("method", "path", "send", "expected"),
    MALFORMED,
    ids=[f"{m} {p[:40]} {str(s)[:30]}" for m, p, s, _ in MALFORMED],
)
def test_malformed_request_is_a_readable_4xx(
    server: RunningServer, method: str, path: str, send: dict[str, Any], expected: int
) -> None:
    if "content" in send:
        send = send | {"headers": {"Content-Type": "application/json"}}
    with server.client("admin") as admin:
        response = admin.request(method, path, **send)
        assert response.status_code == expected, response.text
        assert response.json()["error"]
        assert admin.get("/v1/whoami").status_code == 200  # same connection, still served


def test_racing_creates_of_one_tenant_are_200_or_409(server: RunningServer) -> None:
    """Two servers' worth of PUTs of a new tenant at once: the loser's INSERT hits the primary
    key (PostgreSQL: IntegrityError, once a 500); it is a 409 to retry, never a 500."""
    statuses: list[int] = []
    barrier = threading.Barrier(4)

    def put(name: str) -> None:
        with server.client("admin") as admin:
            barrier.wait()
            statuses.append(admin.put(f"/v1/tenants/{name}", json={"name": name}).status_code)

    for round_ in range(10):
        threads = [threading.Thread(target=put, args=(f"race-{round_}",)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert set(statuses) <= {200, 409}, statuses


def test_an_unreachable_database_is_503(pg_database: str, tmp_path: Path) -> None:
    """The store's database is dropped under a running server: 503 with Retry-After, not 500."""
    scratch = f"{make_url(pg_database).database}_gone"
    admin_engine = create_engine(
        make_url(pg_database).set(database="postgres"), isolation_level="AUTOCOMMIT"
    )
    with admin_engine.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{scratch}"'))
    url = make_url(pg_database).set(database=scratch).render_as_string(hide_password=False)
    plane = open_plane(tmp_path, url)
    issued = plane.store.bootstrap_admin()
    assert issued is not None
    try:
        with serve(plane) as base:
            with admin_engine.connect() as connection:
                connection.execute(text(f'DROP DATABASE "{scratch}" WITH (FORCE)'))
            response = httpx.get(
                f"{base}/v1/whoami", headers={"Authorization": f"Bearer {issued.token}"}
            )
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"] == "1"
    finally:
        plane.store.close()
        with admin_engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)'))
        admin_engine.dispose()
