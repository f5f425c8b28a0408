"""The web dashboard end to end: a real server over a live control loop, Debian's chromium driven
by Playwright. Screenshots go to test-artifacts/ (gitignored)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import RunningServer, serve
from browser import LAPTOP, WIDE, chromium, screenshot, sign_in
from liveplane import leading, open_live_plane, racks, run_gang, submit, users, wait_for
from matplotlib.figure import Figure
from modelkit import write_export
from playwright.sync_api import Browser, Page, expect
from serving import register_mlp

from aicluster.api.clustermap import ClusterMapOut
from aicluster.control.views.metrics import SERVING
from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.store import NodeHealth, Role

pytestmark = pytest.mark.integration

#: name -> (tenant, who submits, workers, GPUs per worker); llama-70b cannot fit its quota.
JOBS = {
    "gpt-pretrain": ("a", "alice", 2, 8),
    "bert-finetune": ("a", "alice", 1, 4),
    "secret-b-train": ("b", "bob", 2, 8),
    "llama-70b": ("a", "alice", 8, 8),
}
RUNNING_GPUS = {"a": 20, "b": 16}


def write_report(state: Path) -> None:
    """A simulation report as ``aicluster sim --out <state>/reports/philly-demo`` leaves one."""
    out = state / "reports" / "philly-demo"
    out.mkdir(parents=True)
    runs = [
        {"policy": p, "completed": 1000, "jct_mean": j, "queue_delay_mean": w, "utilization": u,
         "jain_fairness": 0.9, "preemptions": 3, "goodput": 0.95,
         "lost_gpu_hours_preemptions": 12.0, "evictions_per_gpu_hour": 0.0123}
        for p, j, w, u in (("fifo", 36000, 9000, 0.71), ("fair", 25000, 4000, 0.83))
    ]  # fmt: skip
    (out / "summary.json").write_text(json.dumps({"runs": runs, "settings": {}}))
    figure = Figure(figsize=(6, 3))
    axes = figure.subplots()
    axes.plot([0, 1, 2, 3], [10, 60, 80, 75], label="fair")
    axes.set_title("Utilization over time")
    figure.savefig(out / "timeline.png", dpi=80)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    state = tmp_path_factory.mktemp("state")
    tenants = [
        Tenant("a", quota={"H100": 48}, borrow_limit={"H100": 8}),
        Tenant("b", quota={"H100": 32}),
    ]
    plane = open_live_plane(state, tenants, racks(2, 2, 3))  # 12 nodes, 96 GPUs
    store = plane.store
    store.set_node_health("node-1-1-2", NodeHealth.UNHEALTHY, "test", "Ray node is down")
    store.set_node_health("node-1-1-1", NodeHealth.CORDONED, "test", "replacing a DIMM")
    tokens = users(store, {"alice": ("a", Role.MEMBER), "bob": ("b", Role.MEMBER)})
    write_report(state)
    # A model of tenant a served as a 90/10 split (store records, as the serving layer writes
    # them), and the request figures its gateway would have exported.
    for _ in range(2):
        register_mlp(store, "a", "chat", state / "exports")
    store.put_deployment("a", "chat", {"replicas": 1}, {1: 100}, "alice")
    store.set_traffic("a", "chat", {1: 90, 2: 10}, "alice", "canary step 1")
    SERVING.set_traffic("a", "chat", "1", 0.9)
    SERVING.set_traffic("a", "chat", "2", 0.1)
    for seconds, ok in ((0.03, True), (0.05, True), (0.2, False)):
        SERVING.observe("a", "chat", "2", seconds, ok)
    with leading(plane), serve(plane) as url:
        yield RunningServer(url, plane, tokens)
    store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh tab; the test fails if the page threw or logged an error (a CSP violation, a
    script error). Refused requests (401, 404) are expected and not counted."""
    context = browser.new_context(viewport=LAPTOP)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    yield opened
    context.close()
    assert errors == []


def submit_jobs(server: RunningServer) -> dict[str, str]:
    """Submit JOBS through the API (idempotent); their ids once the loop has placed or queued
    them."""
    ids = {}
    for name, (tenant, who, workers, gpus) in JOBS.items():
        spec = {
            "name": name,
            "tenant": tenant,
            "module": "train",
            "workers": workers,
            "resources": {"gpus": gpus, "gpu_type": "H100"},
        }
        with server.client(who) as client:
            answer = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": name})
        assert answer.status_code == 201, answer.text
        ids[name] = answer.json()["id"]
    store = server.plane.store
    wait_for(lambda: store.get_job(None, ids["llama-70b"]).pending_reason is not None, "a reason")
    for name in ("gpt-pretrain", "bert-finetune", "secret-b-train"):
        wait_for(lambda n=name: store.get_job(None, ids[n]).placement is not None, f"{name} placed")
    return ids


def busy_cells(page: Page) -> tuple[int, int]:
    return page.locator("#map .g.busy").count(), page.locator("#map .g.x").count()


def test_sign_in_and_watch_the_cluster_map_fill(server: RunningServer, page: Page) -> None:
    page.goto(f"{server.url}/")  # / redirects to the dashboard
    expect(page.locator("#login-form")).to_be_visible()
    page.fill("#token", "aic_not_a_token")
    page.click("#sign-in")
    expect(page.locator("#login-error")).to_contain_text("not valid")
    screenshot(page, "01-login")

    page.fill("#token", server.tokens["alice"])
    page.click("#sign-in")
    page.wait_for_selector("#map")
    expect(page.locator("#who")).to_contain_text("alice")
    assert page.get_attribute("#map", "data-busy") == "0"
    expect(page.locator(".node.unhealthy")).to_have_count(1)
    expect(page.locator(".node.cordoned")).to_have_count(1)
    # Each rack's draw in its header: the power model's (no node reports a meter here)
    expect(page.locator(".rack h4 .kw")).to_have_count(4)
    expect(page.locator(".rack h4 .kw").first).to_have_text("1.4 kW*")
    expect(page.locator(".stats")).to_contain_text("kW drawn (modelled where not measured)")
    page.evaluate("window.__notReloaded = true")

    submit_jobs(server)
    total = sum(RUNNING_GPUS.values())
    page.wait_for_selector(f'#map[data-busy="{total}"]', timeout=20_000)
    assert busy_cells(page) == (RUNNING_GPUS["a"], RUNNING_GPUS["b"])  # bob's are anonymous
    assert page.evaluate("window.__notReloaded") is True  # live update, no reload
    page.hover("#map .g.busy >> nth=0")
    expect(page.locator("#tip")).to_contain_text("tenant a")
    expect(page.locator("#tip")).to_contain_text("power on")
    expect(page.locator("#tip")).to_contain_text("W (modelled)")
    screenshot(page, "02-cluster-map-1366x768")
    page.set_viewport_size(WIDE)
    screenshot(page, "03-cluster-map-2560x1440")


def test_job_page_shows_training(server: RunningServer, page: Page) -> None:
    ids = submit_jobs(server)
    run_gang(server.plane, ids["gpt-pretrain"], steps=80, slow_rank=1)
    sign_in(page, server.url, server.tokens["alice"])
    page.click("#map .g.busy >> nth=0")  # a GPU of gpt-pretrain (the oldest job) opens its page
    expect(page.locator("#job-name")).to_have_text("gpt-pretrain")
    expect(page.locator("#job-state")).to_contain_text("RUNNING", timeout=10_000)
    expect(page.locator("#loss-chart path.chart-line")).to_have_count(1)
    assert page.locator("#loss-chart line.ckpt").count() == 4  # a checkpoint every 20 steps
    assert page.locator("#step-heatmap rect.slow").count() > 0  # rank 1 slowed down
    expect(page.locator("#jitter-job")).to_have_text("0.200 s")  # 0.3 s - 0.1 s per step
    expect(page.locator("#score")).to_contain_text("free_left_on_nodes")
    expect(page.locator("#state-bar span")).to_have_count(3)  # PENDING, STARTING, RUNNING
    expect(page.locator("#log-text")).to_contain_text("rank 0 step 80")
    expect(page.locator("#goodput")).to_contain_text("ETTR")
    screenshot(page, "04-job-page-1366x768")
    page.set_viewport_size(WIDE)
    screenshot(page, "05-job-page-2560x1440")


def test_a_pending_job_shows_its_reason(server: RunningServer, page: Page) -> None:
    ids = submit_jobs(server)
    with server.client("alice") as client:
        why = client.get(f"/v1/jobs/{ids['llama-70b']}/why").json()
    assert why["state"] == "PENDING" and why["code"]
    assert why["estimated_start"] is None  # the jobs it waits for give no run time
    sign_in(page, server.url, server.tokens["alice"])
    page.click("#nav a[data-view=queue]")
    row = page.locator(f'tr[data-job="{ids["llama-70b"]}"]')
    expect(row).to_contain_text(why["reason"])
    expect(row).to_contain_text(why["code"])
    expect(row.locator("td.est")).to_have_text("–")
    screenshot(page, "06-queue")
    row.locator("a").click()
    expect(page.locator("#why-reason")).to_have_text(why["reason"])
    expect(page.locator("#why-code")).to_have_text(why["code"])
    expect(page.locator("#why-start")).to_contain_text("Estimated start: unknown")
    screenshot(page, "07-pending-job")


def test_a_failed_job_shows_its_failure_as_text(server: RunningServer, page: Page) -> None:
    """Its rank, node, exit and stderr's last lines; what the job wrote is shown, not run."""
    store = server.plane.store
    job_id = submit(store, "a", "raises", workers=8, gpus=8)  # over a's quota: never placed
    tail = ["Traceback (most recent call last):", "<img src=x onerror=alert(1)>", "ValueError: nan"]
    failure = {"rank": 1, "node": "node-0-0-1", "summary": "rank 1 on node-0-0-1 exited with "
               "code 1", "exit_code": 1, "signal": None, "lost": False, "attempt": 1,
               "stderr_tail": tail}  # fmt: skip
    reason = "rank 1 on node-0-0-1 exited with code 1: ValueError: nan (after 0 restarts)"
    store.transition(
        job_id, JobState.FAILED, "control-loop", reason=reason, exit_code=1, failure=failure
    )
    sign_in(page, server.url, server.tokens["alice"])
    page.goto(f"{server.url}/ui/#/job/{job_id}")
    expect(page.locator("#why h3")).to_have_text("Why it failed")
    expect(page.locator("#why-reason")).to_have_text(reason)
    expect(page.locator("#why-failure")).to_contain_text("1 on node-0-0-1")
    expect(page.locator("#why-tail")).to_have_text("\n".join(tail))
    assert page.locator("#why img").count() == 0
    screenshot(page, "08-failed-job")


def test_another_tenant_sees_none_of_it(server: RunningServer, page: Page) -> None:
    ids = submit_jobs(server)
    secrets = [*(ids[n] for n in JOBS if JOBS[n][0] == "a"), "gpt-pretrain", "llama-70b", "chat"]
    sign_in(page, server.url, server.tokens["bob"])
    page.wait_for_selector(f'#map[data-busy="{sum(RUNNING_GPUS.values())}"]')
    assert busy_cells(page) == (RUNNING_GPUS["b"], RUNNING_GPUS["a"])
    screenshot(page, "08-other-tenant-cluster-map")
    for view in ("cluster", "queue", "jobs", "tenants", "deployments", "models", "pipelines"):
        page.goto(f"{server.url}/ui/#/{view}")
        page.wait_for_selector("#view[data-ready]")
        html = page.content()
        assert not [s for s in secrets if s in html], view
    page.goto(f"{server.url}/ui/#/job/{ids['gpt-pretrain']}")
    expect(page.locator("#view .error")).to_contain_text("no job")
    with server.client("bob") as client:
        answer = client.get("/v1/ui/cluster-map").text
        text = answer + client.get("/v1/ui/deployments").text
    assert not [s for s in secrets if s in text]
    seen = ClusterMapOut.model_validate_json(answer)
    assert {job.tenant for job in seen.jobs} == {"b"} and "a" not in seen.tenants
    hidden = [
        gpus for p in seen.pods for r in p.racks for n in r.nodes for i, gpus in n.slots if i < 0
    ]
    assert sum(hidden) == RUNNING_GPUS["a"]


def test_tenants_deployments_and_reports(server: RunningServer, page: Page) -> None:
    submit_jobs(server)
    sign_in(page, server.url, server.tokens["alice"])
    page.click("#nav a[data-view=tenants]")
    expect(page.locator("#view table").first).to_contain_text("48")  # a's quota
    # The cost of preemption of a's running jobs only (GET /v1/cluster scopes it to alice's).
    expect(page.locator("#preemption-cost tbody tr")).to_have_count(1)
    expect(page.locator("#preemption-cost tbody tr")).to_contain_text("a")
    assert "secret" not in page.content()
    screenshot(page, "09-tenants")
    page.click("#nav a[data-view=deployments]")
    expect(page.locator("#view")).to_contain_text("a/chat")
    expect(page.locator("#view")).to_contain_text("33.33%")  # one error in three requests
    expect(page.locator("#view")).to_contain_text("canary step 1")  # the rollout history
    expect(page.locator("#view")).to_contain_text("v1 100% → v1 90% · v2 10%")  # read, not JSON
    screenshot(page, "10-deployments")
    page.click("#nav a[data-view=reports]")
    expect(page.locator(".report[data-report=philly-demo]")).to_contain_text("fair")
    expect(page.locator(".report[data-report=philly-demo]")).to_contain_text("0.0123")
    plot = page.locator(".plots img").first
    expect(plot).to_have_attribute("src", re.compile(r"^blob:"))  # fetched with the token
    wait_for(lambda: plot.evaluate("img => img.complete && img.naturalWidth > 0"), "the plot")
    screenshot(page, "11-simulation-reports")


@pytest.mark.parametrize("viewport", [LAPTOP, WIDE], ids=["1366x768", "2560x1440"])
def test_views_fit_the_screen(server: RunningServer, page: Page, viewport: dict[str, int]) -> None:
    ids = submit_jobs(server)
    page.set_viewport_size(viewport)
    sign_in(page, server.url, server.tokens["admin"])
    views = ("cluster", "queue", "jobs", "tenants", "deployments", "reports", "audit", "job")
    for view in (*views, "models", "pipelines"):
        suffix = f"/{ids['gpt-pretrain']}" if view == "job" else ""
        page.goto(f"{server.url}/ui/#/{view}{suffix}")
        page.wait_for_selector("#view[data-ready]")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{view} is {overflow}px wider than the window"
    screenshot(page, f"12-admin-job-{viewport['width']}x{viewport['height']}")


def test_signing_out_forgets_the_token(server: RunningServer, page: Page) -> None:
    """The token lives in an HttpOnly, SameSite=Strict cookie that no script can read; signing
    out makes the server forget it."""
    token = server.tokens["alice"]
    sign_in(page, server.url, token)
    (cookie,) = page.context.cookies()
    assert (cookie["name"], cookie["value"]) == ("aicluster_session", token)
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    readable = "JSON.stringify([document.cookie, {...sessionStorage}, {...localStorage}])"
    assert token not in page.evaluate(readable)
    page.reload()  # the session outlives a reload (and opens in a new tab)
    expect(page.locator("#who")).to_contain_text("alice")
    page.click("#logout")
    expect(page.locator("#login-form")).to_be_visible()
    wait_for(lambda: page.context.cookies() == [], "the session cookie to go")
    page.reload()
    expect(page.locator("#login-form")).to_be_visible()


def test_an_unsandboxed_cluster_says_so_on_every_page(server: RunningServer, page: Page) -> None:
    sign_in(page, server.url, server.tokens["alice"])
    expect(page.locator("#who")).to_contain_text("alice")
    expect(page.locator("#unsandboxed")).to_be_hidden()  # this server sandboxes its jobs
    plane = server.plane
    sandboxed = plane.settings
    plane.settings = dataclasses.replace(sandboxed, sandbox=False)  # as --insecure-no-sandbox
    try:
        page.reload()
        expect(page.locator("#unsandboxed")).to_be_visible()
        expect(page.locator("#unsandboxed")).to_have_text("UNSANDBOXED")
    finally:
        plane.settings = sandboxed


def test_the_audit_page_shows_only_the_members_tenant(server: RunningServer, page: Page) -> None:
    ids = submit_jobs(server)
    a_ids = [ids[name] for name in JOBS if JOBS[name][0] == "a"]
    sign_in(page, server.url, server.tokens["bob"])
    page.click("#nav a[data-view=audit]")
    rows = page.locator("#audit-events tbody tr")
    expect(rows.first).to_be_visible()
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.tenant)")) == {"b"}
    expect(page.locator("#audit-events")).to_contain_text(ids["secret-b-train"])
    assert not [job_id for job_id in a_ids if job_id in page.content()]
    page.fill("#audit-form input[name=action]", "api.")
    page.click("#audit-filter")
    page.wait_for_selector('#audit-table[data-query*="action=api."]')
    expect(page.locator("#audit-events")).to_contain_text("api.submit_job")
    kinds = page.locator("#audit-events tbody td:nth-child(3)").all_inner_texts()
    assert kinds and all(kind.startswith("api.") for kind in kinds)
    page.fill("#audit-form input[name=tenant]", "a")  # not bob's: the server refuses it
    page.click("#audit-filter")
    expect(page.locator("#audit-error")).to_contain_text("no tenant 'a'")
    screenshot(page, "13-audit-other-tenant")
    page.context.clear_cookies()  # sign in again, as alice
    sign_in(page, server.url, server.tokens["alice"])
    page.goto(f"{server.url}/ui/#/audit")
    expect(page.locator("#audit-events")).to_contain_text(ids["gpt-pretrain"])
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.tenant)")) == {"a"}
    assert ids["secret-b-train"] not in page.content()


def test_the_jobs_page_says_which_model_a_service_job_serves(
    server: RunningServer, page: Page
) -> None:
    spec = jobspec_from_mapping(
        {"name": "svc-chat.v1", "module": "aicluster.serve.replica", "resources": {"gpus": 1}}
    )
    store = server.plane.store
    replica, _ = store.submit_job("a", spec, "serving", service={"model": "chat", "version": 1})
    batch = submit_jobs(server)["bert-finetune"]
    sign_in(page, server.url, server.tokens["alice"])
    page.click("#nav a[data-view=jobs]")
    rows = page.locator("tbody tr")
    expect(rows.filter(has_text=replica.id)).to_contain_text("service · chat v1")
    expect(rows.filter(has_text=batch)).not_to_contain_text("service ·")


def test_the_model_page_draws_lineage_and_the_pipelines_page_shows_runs(
    server: RunningServer, page: Page, tmp_path: Path
) -> None:
    store = server.plane.store
    shard = {"sha256": "5" * 64, "size": 4}
    manifest = {"format": 1, "files": [{"path": "r", "size": 4, "pieces": [[0, 0, 4]]}]}
    rows, _ = store.create_dataset_version(
        "a", "rows", {**manifest, "shards": [shard]}, "6" * 64, "alice", default_quota=1 << 20
    )
    spec = {"name": "lineage-demo", "entrypoint": "t.py", "data": [f"rows:{rows.version}"]}
    job, _ = store.submit_job("a", jobspec_from_mapping(spec), "alice")
    store.cancel_job("a", job.id, "alice")
    wait_for(lambda: store.get_job("a", job.id).state.terminal, "the cancel")
    store.register_model_version(
        "a", "lineage-demo", source_dir=write_export(tmp_path / "export"), job_id=job.id,
        spec_hash=job.spec_hash, code_version="0" * 64, dataset_hash=None, metrics={"loss": 1.0},
        registered_by="alice",
    )  # fmt: skip
    store.delete_dataset_version("a", "rows", rows.version, "alice")  # shows as deleted
    pipeline = {
        "name": "chat-fresh",
        "deployment": "chat",
        "job": {"name": "chat", "entrypoint": "t.py"},
        "triggers": {"schedule_s": 3600},
    }
    made = store.create_pipeline("a", "chat-fresh", pipeline, {"last_fired": 0}, "alice")
    run = store.start_pipeline_run(made, ["schedule: 3600 s since the last run"], {}, "test")
    store.move_pipeline_run(run, "training", "test", job_id=job.id)
    sign_in(page, server.url, server.tokens["alice"])
    page.click("#nav a[data-view=models]")
    page.click("#models a:text('lineage-demo')")
    chain = page.locator("#lineage > li")
    expect(chain.nth(0)).to_contain_text(f"dataset rows:{rows.version}")
    expect(chain.nth(0)).to_contain_text("deleted")
    expect(chain.nth(1)).to_contain_text(f"job {job.id}")
    expect(chain.nth(2)).to_contain_text("model lineage-demo:1")
    expect(chain.nth(3)).to_contain_text("not deployed")
    screenshot(page, "13-model-lineage")
    page.click("#nav a[data-view=pipelines]")
    card = page.locator(".pipeline", has_text="chat-fresh")
    expect(card).to_contain_text("serves chat")
    expect(card.locator("tr.run")).to_contain_text("training")
    expect(card.locator("tr.run")).to_contain_text(job.id)
    screenshot(page, "14-pipelines")
    # Another tenant sees neither.
    page.click("#logout")
    sign_in(page, server.url, server.tokens["bob"])
    page.goto(f"{server.url}/ui/#/pipelines")
    expect(page.locator("#no-pipelines")).to_be_visible()
    page.goto(f"{server.url}/ui/#/model/a/lineage-demo:1")
    expect(page.locator("#view .error")).to_be_visible()
    assert job.id not in page.content()
