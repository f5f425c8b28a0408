"""Every 4xx answers the API's error JSON, ``{"error": ...}``, that a person can read: a body
over the cap, a missing token, a role too small, a path or a method no route has, an unknown
job, a state filter naming an unknown state, a cancel of a finished job. On the in-process
server (uvicorn in a thread, a real store), no Ray."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from apiserver import RunningServer, serve_tenants
from fastapi import FastAPI, Response

from aicluster.api.errors import ReadableErrors
from aicluster.core import JobState, Node, Tenant, jobspec_from_mapping
from aicluster.store import Role

pytestmark = pytest.mark.integration

SPEC = "name: x\ntenant: a\nmodule: t\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    state = tmp_path_factory.mktemp("state")
    with serve_tenants(
        str(state),
        state,
        [Tenant("a", quota={"H100": 8})],
        {"alice": ("a", Role.MEMBER), "vic": ("a", Role.VIEWER)},
        [
            Node("node-0", 8, "H100", "rack-0", "pod-0"),
            Node("node-1", 8, "H100", "rack-0", "pod-0"),
        ],
    ) as running:
        yield running


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) <= {"error", "problems"} and body["error"], body
    return str(body["error"])


def test_every_refusal_has_a_readable_json_body(server: RunningServer) -> None:
    big = b"x" * (2 << 20)
    with server.client("alice") as alice, server.client("vic") as vic, server.client() as anon:
        assert "larger than 1048576 bytes" in _error(alice.post("/v1/jobs", content=big), 413)
        streamed = alice.post("/v1/jobs", content=iter([big[: 1 << 20]] * 3))
        assert "larger than" in _error(streamed, 413)
        assert "bearer token" in _error(anon.get("/v1/jobs"), 401)
        assert "member role" in _error(vic.post("/v1/jobs", content=SPEC), 403)
        assert _error(alice.get("/v1/nope"), 404) == (
            "no such path: /v1/nope (the API's routes are listed at /docs)"
        )
        assert (
            _error(alice.post("/healthz"), 405) == "POST is not allowed on /healthz (allowed: GET)"
        )
        assert _error(alice.get("/v1/jobs/j-nothere"), 404) == "no job 'j-nothere'"
        head = alice.head("/v1/nope")
        assert (head.status_code, head.content) == (404, b"")


def test_state_filters_take_comma_lists_and_name_the_allowed_states(
    server: RunningServer,
) -> None:
    store = server.plane.store
    done, _ = store.submit_job("a", jobspec_from_mapping({"name": "d", "entrypoint": "t.py"}), "t")
    store.cancel_job("a", done.id, "t")
    waiting, _ = store.submit_job(
        "a", jobspec_from_mapping({"name": "w", "entrypoint": "t.py"}), "t"
    )
    with server.client("alice") as alice:
        for query in ("CANCELLED,PENDING", "cancelled, pending", ["CANCELLED", "PENDING"]):
            page = alice.get("/v1/jobs", params={"state": query})
            assert page.status_code == 200, page.text
            assert {job["id"] for job in page.json()["jobs"]} >= {done.id, waiting.id}
        only = alice.get("/v1/jobs", params={"state": "CANCELLED"}).json()["jobs"]
        assert {job["state"] for job in only} == {"CANCELLED"}
        message = _error(alice.get("/v1/jobs", params={"state": "FAILED,DONE"}), 422)
        allowed = ", ".join(state.value for state in JobState)
        assert message == f"unknown state 'DONE': give one of {allowed}"


def test_cancelling_a_finished_job_says_there_is_nothing_to_cancel(server: RunningServer) -> None:
    store = server.plane.store
    job, _ = store.submit_job("a", jobspec_from_mapping({"name": "f", "entrypoint": "t.py"}), "t")
    for state in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
        store.transition(job.id, state, "test")
    with server.client("alice") as alice:
        answer = alice.post(f"/v1/jobs/{job.id}/cancel")
    assert _error(answer, 409) == f"job {job.id} already SUCCEEDED; nothing to cancel"


def _call(app: Any, method: str, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request straight to the ASGI app: its status, headers and body."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    start, *bodies = sent
    return start["status"], dict(start["headers"]), b"".join(b["body"] for b in bodies)


def test_an_empty_4xx_from_any_route_gets_the_error_body() -> None:
    app = FastAPI()

    @app.api_route("/bare", methods=["GET", "HEAD"])
    def bare() -> Response:
        return Response(status_code=404)

    wrapped = ReadableErrors(app)
    status, headers, body = _call(wrapped, "GET", "/bare")
    assert (status, headers[b"content-type"]) == (404, b"application/json")
    assert json.loads(body) == {"error": "not found"}
    assert headers[b"content-length"] == str(len(body)).encode()
    assert _call(wrapped, "HEAD", "/bare")[::2] == (404, b"")
