"""The API's principal cache on a real server and store: a token is trusted for at most
``auth_cache_s`` after a change made elsewhere, at once after a change made through this
server, and never past its expiry. Time is a ManualClock shared by the server and the store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from apiserver import serve

from aicluster.api import ServerSettings
from aicluster.control import ControlPlane
from aicluster.core import ManualClock, Tenant
from aicluster.store import Store

pytestmark = pytest.mark.integration

TTL = 2.0


@dataclass
class Setup:
    url: str
    store: Store
    clock: ManualClock
    admin: str

    def whoami(self, token: str) -> int:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(f"{self.url}/v1/whoami", headers=headers, timeout=10).status_code


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    clock = ManualClock(1_700_000_000.0)
    store = Store.open(tmp_path, clock=clock)
    admin = store.bootstrap_admin()
    assert admin is not None
    store.create_tenant(Tenant("a"), "test")
    store.create_user("alice", "test")
    settings = ServerSettings(state_dir=tmp_path, auth_cache_s=TTL)
    with serve(ControlPlane(settings=settings, store=store, clock=clock)) as url:
        yield Setup(url, store, clock, admin.token)
    store.close()


def test_a_revocation_elsewhere_takes_effect_within_the_ttl(setup: Setup) -> None:
    issued = setup.store.create_token("alice", "test")
    assert setup.whoami(issued.token) == 200
    setup.store.revoke_token(issued.info.id, "another-server")  # not through this server
    assert setup.whoami(issued.token) == 200  # still trusted: the price of the cache
    setup.clock.advance(TTL)
    assert setup.whoami(issued.token) == 401


def test_a_revocation_through_this_server_takes_effect_at_once(setup: Setup) -> None:
    issued = setup.store.create_token("alice", "test")
    assert setup.whoami(issued.token) == 200
    headers = {"Authorization": f"Bearer {setup.admin}"}
    revoked = httpx.delete(f"{setup.url}/v1/tokens/{issued.info.id}", headers=headers)
    assert revoked.status_code == 200
    assert setup.whoami(issued.token) == 401


def test_a_role_granted_through_this_server_is_seen_at_once(setup: Setup) -> None:
    token = setup.store.create_token("alice", "test").token
    member = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{setup.url}/v1/whoami", headers=member).json()["roles"] == {}
    headers = {"Authorization": f"Bearer {setup.admin}"}
    body = {"user": "alice", "role": "member"}
    assert httpx.put(f"{setup.url}/v1/tenants/a/members", headers=headers, json=body).is_success
    assert httpx.get(f"{setup.url}/v1/whoami", headers=member).json()["roles"] == {"a": "member"}
    setup.store.revoke_role("alice", "a", "another-server")
    setup.clock.advance(TTL)
    assert httpx.get(f"{setup.url}/v1/whoami", headers=member).json()["roles"] == {}


def test_a_cached_token_still_expires_on_time(setup: Setup) -> None:
    issued = setup.store.create_token("alice", "test", expires_at=setup.clock.now() + TTL / 4)
    assert setup.whoami(issued.token) == 200
    setup.clock.advance(TTL / 4)
    assert setup.whoami(issued.token) == 401


def test_failures_are_not_cached(setup: Setup) -> None:
    token = setup.store.create_token("alice", "test").token
    setup.store.set_user_disabled("alice", True, "test")
    assert setup.whoami(token) == 401
    setup.store.set_user_disabled("alice", False, "test")
    assert setup.whoami(token) == 200  # at once: a refusal is not remembered
