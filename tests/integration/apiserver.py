"""A real control-plane API server on 127.0.0.1 for tests: uvicorn in a thread, real store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvicorn
from ranks import free_port

from aicluster.api import ServerSettings, create_app
from aicluster.control import ControlPlane
from aicluster.core import Node, Tenant
from aicluster.store import Role, Store
from aicluster.store.base import WallClock

#: The TLS context of the tests' HTTP clients (``verify=TLS``): httpx's default one, made once.
#: Without it httpx makes one per client, loading the CA bundle: 0.1-0.2 s of CPU each on a
#: loaded 2-core machine, and the helpers make a client per request and per poll. The servers
#: here speak plain HTTP (test_tls.py makes its own clients).
TLS = httpx.create_ssl_context()


@dataclass
class RunningServer:
    url: str
    plane: ControlPlane
    tokens: dict[str, str] = field(default_factory=dict)

    def client(self, who: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"} if who else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, verify=TLS)


@contextmanager
def serve(plane: ControlPlane) -> Iterator[str]:
    """Serve ``plane``'s API on a free loopback port until the block ends."""
    port = free_port()
    config = uvicorn.Config(create_app(plane), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1, verify=TLS).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def open_plane(state_dir: Path, db_url: str | None = None, auth: bool = True) -> ControlPlane:
    settings = ServerSettings(state_dir=state_dir, db_url=db_url, auth=auth)
    store = Store.open(db_url or state_dir, state_dir=state_dir)
    return ControlPlane(settings=settings, store=store, clock=WallClock())


def open_plane_at(location: str, state_dir: Path) -> ControlPlane:
    """A plane over a store location (``module_store_url``): a state directory or a URL."""
    if "://" in location:
        return open_plane(state_dir, location)
    return open_plane(Path(location))


def users(store: Store, grants: dict[str, tuple[str, Role]]) -> dict[str, str]:
    """Users with one role each; returns their tokens (and the bootstrap admin's)."""
    admin = store.bootstrap_admin()
    assert admin is not None
    tokens = {"admin": admin.token}
    for user, (tenant, role) in grants.items():
        store.create_user(user, "test")
        store.grant_role(user, tenant, role, "test")
        tokens[user] = store.create_token(user, "test").token
    return tokens


@contextmanager
def serve_tenants(
    location: str,
    state_dir: Path,
    tenants: Iterable[Tenant],
    grants: dict[str, tuple[str, Role]],
    nodes: Iterable[Node] = (),
) -> Iterator[RunningServer]:
    """A server over a fresh store at ``location`` (``module_store_url``) with ``tenants``, users
    with one role each (:func:`users`: their tokens, and the admin's) and ``nodes``; the store is
    closed when the block ends."""
    plane = open_plane_at(location, state_dir)
    store = plane.store
    try:
        for tenant in tenants:
            store.create_tenant(tenant, "test")
        tokens = users(store, grants)
        if listed := list(nodes):
            store.upsert_nodes(listed)
        with serve(plane) as url:
            yield RunningServer(url, plane, tokens)
    finally:
        store.close()
