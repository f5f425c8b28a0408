"""Schemathesis over the published OpenAPI schema against a real server and store (SQLite and
PostgreSQL): no request it generates, valid or malformed, as the cluster admin, a tenant member or
nobody, gets a 5xx, nor an answer over the response cap (1 MiB).

Each operation is a test of its own (``schema.parametrize()``); generation is deterministic so a
failure reproduces. Random identifiers would almost always miss and end in a 404, so about half
of the generated path parameters and body fields that name a job, tenant, user, node or token are
swapped for ones that exist. 20 examples per operation in the suite; ``make fuzz`` runs four
times as many (``tests/fuzzing.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import schemathesis
from apiserver import RunningServer, open_plane_at, serve
from hypothesis import settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from aicluster.api import ServerSettings, create_app
from aicluster.core import Node, Tenant
from aicluster.store import Role
from fuzzing import examples

pytestmark = pytest.mark.integration

MAX_EXAMPLES = examples(20)
#: No answer may be larger: lists are paged (``limit`` ≤ 1000), logs come in chunks.
MAX_RESPONSE_BYTES = 1 << 20
JOB_SPEC = "name: fuzz-job\ntenant: a\nmodule: train\nworkers: 2\n"

#: Values that exist on the running server, by parameter or field name (filled by ``server``).
KNOWN: dict[str, list[str]] = {}


def _published_schema() -> dict[str, Any]:
    """The schema the server publishes; it does not depend on state, so no server is needed."""
    plane = SimpleNamespace(settings=ServerSettings(), clock=None, is_leader=lambda: False)
    return create_app(plane).openapi()


SCHEMA = schemathesis.openapi.from_dict(_published_schema())
SCHEMA.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    max_examples=MAX_EXAMPLES,
    deterministic=True,
    database="none",
)


def _known(kind: str, pick: int, generated: Any) -> Any:
    values = KNOWN.get(kind)
    return values[pick % len(values)] if values else generated


def _swap(values: dict[str, Any], pick: int, path: str) -> dict[str, Any]:
    """Replace the identifiers in ``values`` with existing ones, as ``pick`` selects."""
    swapped = dict(values)
    for name in swapped:
        kind = "node" if name == "name" and path.startswith("/v1/nodes") else name
        kind = "tenant" if kind == "name" else kind
        swapped[name] = _known(kind, pick, swapped[name])
    return swapped


def _sometimes_known(strategy: st.SearchStrategy[Any], path: str) -> st.SearchStrategy[Any]:
    swapped = st.tuples(strategy, st.integers(0, 7)).map(
        lambda drawn: _swap(drawn[0], drawn[1], path) if isinstance(drawn[0], dict) else drawn[0]
    )
    return st.one_of(strategy, swapped)


@SCHEMA.hook
def before_generate_path_parameters(
    context: schemathesis.HookContext, strategy: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    return _sometimes_known(strategy, context.operation.path if context.operation else "")


@SCHEMA.hook
def before_generate_body(
    context: schemathesis.HookContext, strategy: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    return _sometimes_known(strategy, "")


@pytest.fixture(scope="module")
def server(
    module_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """Tenants a and b, alice a member of a, a node, and a couple of jobs, on either store."""
    plane = open_plane_at(module_store_url, tmp_path_factory.mktemp("state"))
    # The fuzzer signs in with made-up tokens by the hundred (POST /v1/ui/session), all from
    # 127.0.0.1: with the default limit on failed sign-ins every later request whose token is
    # not cached would be a 429, and the fuzzer would reach nothing (test_api_hostile.py tests
    # the limit).
    plane.settings = dataclasses.replace(plane.settings, failed_logins_per_address="")
    store = plane.store
    admin = store.bootstrap_admin()
    assert admin is not None
    for name in ("a", "b"):
        store.create_tenant(Tenant(name, quota={"H100": 8}), "test")
    store.create_user("alice", "test")
    store.grant_role("alice", "a", Role.MEMBER, "test")
    tokens = {"admin": admin.token, "alice": store.create_token("alice", "test").token}
    # Tokens the fuzzer may revoke; the ones above must keep working.
    spare = [store.create_token(user, "test").info.id for user in ("alice", "admin")]
    store.upsert_nodes([Node("node-0", 8, "H100", "rack-0", "pod-0")])
    with serve(plane) as url:
        running = RunningServer(url, plane, tokens)
        jobs = []
        with running.client("alice") as alice:
            for _ in range(2):
                created = alice.post(
                    "/v1/jobs", content=JOB_SPEC, headers={"Content-Type": "application/yaml"}
                )
                assert created.status_code == 201, created.text
                jobs.append(created.json()["id"])
            assert alice.get("/openapi.json").json() == _published_schema()
        KNOWN.update(
            job_id=jobs, tenant=["a", "b"], node=["node-0"], token_id=spare, user=["alice", "bob"]
        )
        yield running
        KNOWN.clear()
    store.close()


@pytest.fixture(scope="module", params=["admin", "alice"], ids=["admin", "member"])
def who(request: pytest.FixtureRequest) -> str:
    return request.param  # type: ignore[no-any-return]


def within_the_response_cap(ctx: Any, response: Any, case: schemathesis.Case) -> None:
    """A custom check: no answer over :data:`MAX_RESPONSE_BYTES`."""
    size = len(response.content or b"")
    if size > MAX_RESPONSE_BYTES:
        raise AssertionError(
            f"{case.operation.label} answered {size} bytes, over the cap of {MAX_RESPONSE_BYTES}"
        )


def _call(case: schemathesis.Case, server: RunningServer, headers: dict[str, str]) -> None:
    checks: list[Any] = [not_a_server_error, within_the_response_cap]
    case.call_and_validate(base_url=server.url, headers=headers, checks=checks, timeout=30)


@SCHEMA.parametrize()
def test_no_server_errors(case: schemathesis.Case, server: RunningServer, who: str) -> None:
    _call(case, server, {"Authorization": f"Bearer {server.tokens[who]}"})


@SCHEMA.parametrize()
@settings(max_examples=max(1, MAX_EXAMPLES // 4))
def test_no_server_errors_without_a_token(case: schemathesis.Case, server: RunningServer) -> None:
    """Without a token every route but /healthz stops at authentication, before any database
    is read: one store and fewer examples are enough."""
    if server.plane.store.dialect != "sqlite":
        pytest.skip("the same as on SQLite: nothing reaches the database without a token")
    _call(case, server, {})
