"""Hostile requests against real servers: each rule of the API's hardening attacked, and each
attack shown to change nothing.

* Bodies: a YAML alias bomb, deep nesting (YAML and JSON), a spec of too many values, 10 MB
  bodies (declared and streamed) each get a 4xx with a small body, and the server process's peak
  memory hardly moves (``python -m aicluster.server``, as ``aicluster up`` runs it).
* Limits: job submissions per token and per tenant, jobs pending per tenant, failed sign-ins
  per client address and per token id: a 429 with ``Retry-After`` and a message saying which.
* ``--no-auth``: ``aicluster up`` refuses a non-loopback host; a cross-site ``text/plain`` (or
  form) POST, a foreign ``Host`` (DNS rebinding) and a foreign ``Origin`` are refused, and the
  store holds no job of theirs; the CLI's own requests still work.
* The dashboard's session: an ``HttpOnly``, ``SameSite=Strict`` cookie, and writes without its
  CSRF token refused.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from apiserver import RunningServer, serve
from serverproc import ServerProcess, servers_cleanup
from typer.testing import CliRunner

from aicluster.api import ServerSettings
from aicluster.api.auth import CSRF_HEADER, SESSION_COOKIE, csrf_token
from aicluster.cli.client import Client, Target
from aicluster.cli.main import app as cli
from aicluster.control import ControlPlane
from aicluster.core import Tenant
from aicluster.store import Role, Store
from aicluster.store.base import WallClock

pytestmark = pytest.mark.integration

SPEC = "name: {name}\ntenant: {tenant}\nmodule: train\nresources: {{gpus: 0}}\n"
YAML = {"Content-Type": "application/yaml"}
#: What a refusal may weigh: a message, not an echo of what was sent.
SMALL = 2048
#: How much a server's peak resident memory may grow while it refuses every attack below.
MEMORY_GROWTH = 40 << 20

ALIAS_BOMB = "\n".join(
    [
        "name: bomb",
        "tenant: a",
        "module: train",
        "l0: &l0 [x, x, x, x, x, x, x, x, x, x]",
        *(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)),
        "args: *l8",  # 10**9 strings, were it expanded
    ]
)


def spec(name: str, tenant: str = "a") -> str:
    return SPEC.format(name=name, tenant=tenant)


def job_names(state_dir: Path) -> set[str]:
    """The names of every job in the store (read from the store itself, not through the API)."""
    store = Store.open(state_dir, state_dir=state_dir)
    try:
        jobs, _ = store.list_jobs(None, limit=10_000)
        return {job.name for job in jobs}
    finally:
        store.close()


def peak_rss(pid: int) -> int:
    """A process's peak resident memory (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


# -- bodies: a real server process ------------------------------------------------------------


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``python -m aicluster.server`` (no Ray: the API and the store), tenant a."""
    root = tmp_path_factory.mktemp("hostile")
    tenants = root / "tenants.yaml"
    tenants.write_text("tenants:\n  - name: a\n    quota: {H100: 8}\n")
    server = ServerProcess("hostile", root / "state", root / "logs", tenants=tenants)
    with servers_cleanup(server):
        server.start()
        yield server


def admin_client(server: ServerProcess) -> httpx.Client:
    return server.client((server.state_dir / "admin.token").read_text().strip())


def test_bombs_and_huge_bodies_get_a_small_4xx_and_memory_stays_bounded(
    process: ServerProcess,
) -> None:
    assert process.process is not None
    pid = process.process.pid
    with admin_client(process) as admin:
        assert admin.post("/v1/jobs", content=spec("warm-up"), headers=YAML).status_code == 201
        before = peak_rss(pid)
        json_nested = '{"name": "deep", "tenant": "a", "module": "t", "args": '
        attacks: list[tuple[str, dict[str, Any], int, str]] = [
            ("alias bomb", {"content": ALIAS_BOMB, "headers": YAML}, 422, "aliases"),
            ("deep YAML", {"content": "a: " + "[" * 50_000, "headers": YAML}, 422, "deeper"),
            ("deep block YAML", {"content": "- " * 50_000}, 422, "deeper"),
            ("deep JSON", {"content": json_nested + "[" * 60 + "]" * 60 + "}"}, 422, "deeper"),
            ("JSON past the stack", {"content": '{"a":' * 100_000 + "}" * 100_000}, 4, ""),
            (
                "too many values",
                {"content": "name: many\nargs: [" + "0," * 60_000 + "0]", "headers": YAML},
                422,
                "more than 10000 values",
            ),
            (
                "JSON of too many values",
                {"content": json.dumps({"name": "m", "env": {f"K{i}": "" for i in range(6000)}})},
                422,
                "more than 10000 values",
            ),
            ("10 MB declared", {"content": b"x" * (10 << 20), "headers": YAML}, 413, "larger"),
            (
                "10 MB streamed",
                {"content": lambda: iter([b"a: [" + b"0," * (1 << 19)] * 10), "headers": YAML},
                413,
                "larger",
            ),
        ]
        for what, request, status, says in attacks:
            for _ in range(3):
                sent = {
                    key: value() if callable(value) else value for key, value in request.items()
                }
                answer = admin.post("/v1/jobs", **sent)  # (a stream is made anew each time)
                assert answer.status_code == status or (
                    status == 4 and 400 <= answer.status_code < 500
                ), (what, answer.status_code, answer.text[:300])
                assert len(answer.content) < SMALL, (what, len(answer.content))
                assert says in answer.json()["error"], (what, answer.text[:300])
        # Bodies of other routes are bounded alike (parsed by FastAPI: a 4xx, never a 500).
        for body in (b"[" * 500_000, b"x" * (10 << 20), b'{"a":' * 200_000):
            answer = admin.put(
                "/v1/tenants/z", content=body, headers={"Content-Type": "application/json"}
            )
            assert 400 <= answer.status_code < 500 and len(answer.content) < SMALL, body[:10]
        growth = peak_rss(pid) - before
        assert admin.get("/healthz").status_code == 200
    print(f"server peak memory: {before >> 20} MiB before the attacks, +{growth >> 20} MiB after")
    assert growth < MEMORY_GROWTH, f"peak memory grew by {growth >> 20} MiB" + process.context()
    assert job_names(process.state_dir) == {"warm-up"}


# -- limits: in-process servers with small limits ---------------------------------------------


@contextmanager
def limited(tmp_path: Path, **limits: Any) -> Iterator[RunningServer]:
    """A server (uvicorn thread, SQLite) with ``limits`` in its settings; tenants a and b,
    alice and carol members of a, bob of b."""
    settings = ServerSettings(state_dir=tmp_path, **limits)
    store = Store.open(tmp_path, state_dir=tmp_path)
    plane = ControlPlane(settings=settings, store=store, clock=WallClock())
    admin = store.bootstrap_admin()
    assert admin is not None
    tokens = {"admin": admin.token}
    for tenant in ("a", "b"):
        store.create_tenant(Tenant(tenant, quota={"H100": 8}), "test")
    for user, tenant in (("alice", "a"), ("carol", "a"), ("bob", "b")):
        store.create_user(user, "test")
        store.grant_role(user, tenant, Role.MEMBER, "test")
        tokens[user] = store.create_token(user, "test").token
    try:
        with serve(plane) as url:
            yield RunningServer(url, plane, tokens)
    finally:
        store.close()


def assert_429(answer: httpx.Response, says: str, at_most_s: int) -> None:
    assert answer.status_code == 429, answer.text
    retry = int(answer.headers["Retry-After"])
    assert 1 <= retry <= at_most_s, retry
    assert says in answer.json()["error"], answer.text


def test_submissions_per_token_and_per_tenant_are_limited(tmp_path: Path) -> None:
    rates = {"submit_rate_per_token": "5/minute", "submit_rate_per_tenant": "8/minute"}
    with limited(tmp_path, **rates) as server:
        with server.client("alice") as alice, server.client("carol") as carol:
            for n in range(5):
                assert alice.post("/v1/jobs", content=spec(f"a{n}")).status_code == 201
            assert_429(alice.post("/v1/jobs", content=spec("a5")), "with this token", 60)
            for n in range(3):  # carol's own token, the same tenant: 8 in all
                assert carol.post("/v1/jobs", content=spec(f"c{n}")).status_code == 201
            assert_429(carol.post("/v1/jobs", content=spec("c3")), "to tenant 'a'", 60)
        with server.client("bob") as bob:  # another tenant, another token: not limited
            assert bob.post("/v1/jobs", content=spec("b0", "b")).status_code == 201
        names = {job.name for job in server.plane.store.list_jobs(None)[0]}
    assert names == {"a0", "a1", "a2", "a3", "a4", "c0", "c1", "c2", "b0"}


def test_pending_jobs_per_tenant_are_capped(tmp_path: Path) -> None:
    with (
        limited(tmp_path, max_pending_per_tenant=3) as server,
        server.client("alice") as alice,
        server.client("bob") as bob,
    ):
        ids = [alice.post("/v1/jobs", content=spec(f"p{n}")).json()["id"] for n in range(3)]
        assert_429(alice.post("/v1/jobs", content=spec("p3")), "3 jobs waiting", 60)
        assert bob.post("/v1/jobs", content=spec("b0", "b")).status_code == 201
        assert alice.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 200
        time.sleep(1.2)  # the count is read from the store again at most every second
        assert alice.post("/v1/jobs", content=spec("p4")).status_code == 201
        assert_429(alice.post("/v1/jobs", content=spec("p5")), "waiting", 60)


def test_failed_sign_ins_per_address_are_limited(tmp_path: Path) -> None:
    limits = {"failed_logins_per_address": "4/minute", "auth_cache_s": 300.0}
    with limited(tmp_path, **limits) as server:
        with server.client("alice") as alice:
            assert alice.get("/v1/whoami").status_code == 200  # authenticated: cached
        for n in range(4):
            wrong = httpx.get(f"{server.url}/v1/whoami", headers={"Authorization": f"Bearer {n}"})
            assert wrong.status_code == 401
        guess = {"Authorization": "Bearer aic_000000000000_" + "x" * 43}
        assert_429(httpx.get(f"{server.url}/v1/whoami", headers=guess), "from this address", 60)
        # While the address is over its limit no token is looked up, however genuine...
        with server.client("bob") as bob:
            assert_429(bob.get("/v1/whoami"), "failed sign-ins", 60)
        # ...but one this server has just authenticated still works, and the dashboard's sign-in
        # is limited alike.
        with server.client("alice") as alice:
            assert alice.get("/v1/whoami").status_code == 200
        signing_in = httpx.post(f"{server.url}/v1/ui/session", json={"token": "aic_nope"})
        assert_429(signing_in, "failed sign-ins", 60)


def test_failed_sign_ins_per_token_id_are_limited(tmp_path: Path) -> None:
    with limited(tmp_path, failed_logins_per_token="3/minute") as server:
        real = server.tokens["alice"]
        forged = {"Authorization": f"Bearer {real[:-43]}{'A' * 43}"}  # alice's id, a guess
        for _ in range(3):
            assert httpx.get(f"{server.url}/v1/whoami", headers=forged).status_code == 401
        answer = httpx.get(f"{server.url}/v1/whoami", headers=forged)
        assert_429(answer, "with this token id", 60)
        with server.client("bob") as bob:  # other tokens are not affected
            assert bob.get("/v1/whoami").status_code == 200


# -- the dashboard's session -------------------------------------------------------------------


def test_dashboard_session_cookie_is_httponly_strict_and_writes_need_csrf(
    tmp_path: Path,
) -> None:
    with limited(tmp_path) as server:
        token = server.tokens["alice"]
        refused = httpx.post(f"{server.url}/v1/ui/session", json={"token": "aic_not_a_token"})
        assert refused.status_code == 401 and "set-cookie" not in refused.headers
        signed_in = httpx.post(f"{server.url}/v1/ui/session", json={"token": token})
        assert signed_in.status_code == 200, signed_in.text
        cookie = signed_in.headers["set-cookie"]
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/"} <= attributes, cookie
        csrf = signed_in.json()["csrf_token"]
        assert csrf == csrf_token(token) and token not in signed_in.text
        with httpx.Client(base_url=server.url, cookies={SESSION_COOKIE: token}) as browser:
            assert browser.get("/v1/whoami").json()["user"] == "alice"  # reads need no CSRF
            assert browser.get("/v1/ui/session").json()["csrf_token"] == csrf
            for headers in ({}, {CSRF_HEADER: "0" * 64}, {CSRF_HEADER: csrf_token("aic_x")}):
                forged = browser.post("/v1/jobs", content=spec("forged"), headers=headers)
                assert forged.status_code == 403 and "CSRF" in forged.json()["error"]
            assert browser.delete("/v1/ui/session").status_code == 403
            made = browser.post("/v1/jobs", content=spec("mine"), headers={CSRF_HEADER: csrf})
            assert made.status_code == 201, made.text
            out = browser.delete("/v1/ui/session", headers={CSRF_HEADER: csrf})
            assert out.status_code == 204
            assert f'{SESSION_COOKIE}=""' in out.headers["set-cookie"]
            assert "max-age=0" in out.headers["set-cookie"].lower()
        names = {job.name for job in server.plane.store.list_jobs(None)[0]}
    assert names == {"mine"}


# -- --no-auth ---------------------------------------------------------------------------------


def test_up_refuses_no_auth_off_loopback(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["up", "--no-auth", "--host", "0.0.0.0", "--home", str(tmp_path)]
    )
    assert result.exit_code != 0
    assert "authentication disabled" in result.output and "loopback" in result.output
    assert not (tmp_path / "server.json").exists() and not (tmp_path / "ray").exists()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server started as ``aicluster up --no-auth`` starts it (no Ray)."""
    root = tmp_path_factory.mktemp("noauth")
    tenants = root / "tenants.yaml"
    tenants.write_text("tenants:\n  - name: a\n    quota: {H100: 8}\n")
    server = ServerProcess(
        "noauth", root / "state", root / "logs", tenants=tenants, extra_args=("--no-auth",)
    )
    with servers_cleanup(server):
        server.start()
        yield server


def test_no_auth_refuses_cross_site_writes_and_rebound_names(open_server: ServerProcess) -> None:
    url, port = open_server.url, open_server.port
    evil = "http://evil.example"
    attacks = {
        # What a page of another site can send without a CORS preflight: a form or a no-cors
        # fetch, text/plain (the spec as its text), urlencoded or multipart; or no body type.
        "text/plain": {"content": spec("xs-plain"), "headers": {"Content-Type": "text/plain"}},
        "text/plain from a page": {
            "content": spec("xs-origin"),
            "headers": {"Content-Type": "text/plain;charset=UTF-8", "Origin": evil},
        },
        "form": {
            "content": "name=xs-form",
            "headers": {"Content-Type": "application/x-www-form-urlencoded"},
        },
        "multipart": {"files": {"spec": ("spec.yaml", spec("xs-multipart"))}},
        "no type": {"content": spec("xs-none"), "headers": {"Content-Type": ""}},
        # DNS rebinding: evil.example now resolves to 127.0.0.1, so the page is same-origin.
        "rebound Host": {
            "content": json.dumps({"name": "xs-rebound", "tenant": "a", "module": "t"}),
            "headers": {"Content-Type": "application/json", "Host": f"evil.example:{port}"},
        },
        "rebound, as the CLI": {
            "content": spec("xs-rebound-cli"),
            "headers": {"Host": f"evil.example:{port}", "X-Aicluster-Client": "cli", **YAML},
        },
        "another port": {
            "content": spec("xs-port"),
            "headers": {"Host": f"127.0.0.1:{port + 1}", **YAML},
        },
        "foreign Origin": {"content": spec("xs-cors"), "headers": {"Origin": evil, **YAML}},
        "null Origin": {"content": spec("xs-null"), "headers": {"Origin": "null", **YAML}},
    }
    with httpx.Client(base_url=url) as client:
        for what, request in attacks.items():
            answer = client.post("/v1/jobs", **request)
            assert answer.status_code == 403, (what, answer.status_code, answer.text)
            assert len(answer.content) < SMALL
        # Reads through a rebound name are refused as well: the page could read the answer.
        rebound = client.get("/v1/jobs", headers={"Host": f"evil.example:{port}"})
        assert rebound.status_code == 403 and "Host" in rebound.json()["error"]
        assert client.get("/v1/jobs", headers={"Origin": evil}).status_code == 403
        # This machine's own programs: JSON or YAML bodies, or the CLI's header.
        for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
            name = f"ok-json-{host.split(':')[0]}"
            body = {"name": name, "tenant": "a", "module": "t"}
            answer = client.post("/v1/jobs", json=body, headers={"Host": host})
            assert answer.status_code == 201, answer.text
        assert client.post("/v1/jobs", content=spec("ok-yaml"), headers=YAML).status_code == 201
        same_origin = {"Origin": url, **YAML}
        assert client.post("/v1/jobs", content=spec("ok-page"), headers=same_origin).is_success
    with _cli(url) as cli_client:
        cli_client.submit(spec("ok-cli"))
        job = cli_client.get("/v1/jobs")["jobs"][0]
        cli_client.post(f"/v1/jobs/{job['id']}/cancel")  # no body: the CLI's header suffices
    names = job_names(open_server.state_dir)
    assert not [name for name in names if name.startswith("xs-")], names
    assert {"ok-json-127.0.0.1", "ok-json-localhost", "ok-yaml", "ok-page", "ok-cli"} <= names


@contextmanager
def _cli(url: str) -> Iterator[Client]:
    yield Client(Target(url, None))


def test_no_auth_a_browser_on_another_site_creates_nothing(open_server: ServerProcess) -> None:
    """Debian's chromium shows a page of another site (http://evil.example, served by the test)
    that attacks the server without auth on 127.0.0.1: a form posted as text/plain whose body
    is a valid YAML spec, and a no-cors fetch of one. The browser sends both; the server
    refuses both with 403 and the store holds no job of theirs."""
    from browser import ARGS, CHROMIUM
    from playwright.sync_api import sync_playwright

    target = f"{open_server.url}/v1/jobs"
    form_spec = "name: xs-browser-form\ntenant: a\nmodule: t\n#"  # "#=" ends it
    fetch_spec = spec("xs-browser-fetch")
    page_html = f"""<!doctype html><html><body>
      <form id="f" method="post" enctype="text/plain" action="{target}">
        <input type="hidden" name="{form_spec}" value=""></form>
      <script>
        window.fetched = fetch({json.dumps(target)}, {{method: "POST", mode: "no-cors",
          headers: {{"Content-Type": "text/plain"}}, body: {json.dumps(fetch_spec)}}})
          .then(() => "sent", (error) => String(error));
      </script></body></html>"""
    # Chromium's own Private/Local Network Access checks would stop the requests before they
    # leave the browser; other browsers (and older ones) have none: turned off, so that what is
    # tested is the server's refusal.
    off = "BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights,"
    off += "PrivateNetworkAccessRespectPreflightResults,LocalNetworkAccessChecks"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=[*ARGS, f"--disable-features={off}"]
        )
        context = browser.new_context()
        page = context.new_page()
        page.route(
            "http://evil.example/**",
            lambda route: route.fulfill(status=200, body=page_html, content_type="text/html"),
        )
        seen: list[tuple[str, int]] = []
        page.on("response", lambda r: seen.append((r.request.method, r.status)))
        page.goto("http://evil.example/")
        assert page.evaluate("window.fetched") == "sent"
        with page.expect_navigation() as navigation:
            page.evaluate("document.getElementById('f').submit()")
        response = navigation.value
        assert response is not None and response.status == 403, response and response.text()
        assert "Origin" in response.text()
        browser.close()
    assert ("POST", 403) in seen  # the form's answer; the fetch's is opaque to the page
    names = job_names(open_server.state_dir)
    assert not [name for name in names if name.startswith("xs-")], names
