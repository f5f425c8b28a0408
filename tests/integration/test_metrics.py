"""``GET /metrics`` on a real server over a live control loop: auth, families and labels,
tenant scoping, the text format checked by prometheus_client's parser and by promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from apiserver import RunningServer, serve
from liveplane import leading, open_live_plane, racks, run_gang, submit, users, wait_for
from prometheus_client.parser import text_string_to_metric_families

from aicluster.control.views.metrics import SERVING
from aicluster.core import JobState, Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

PROMTOOL = Path(__file__).resolve().parents[2] / ".tools/prometheus/usr/bin/promtool"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    state = tmp_path_factory.mktemp("state")
    tenants = [Tenant("a", quota={"H100": 16}), Tenant("b", quota={"H100": 8})]
    plane = open_live_plane(state, tenants, racks(1, 2, 2))  # 4 nodes, 32 GPUs
    tokens = users(plane.store, {"alice": ("a", Role.VIEWER), "bob": ("b", Role.MEMBER)})
    store = plane.store
    with leading(plane), serve(plane) as url:
        running = submit(store, "a", "train-a", workers=2, gpus=8)
        submit(store, "b", "train-b", workers=1, gpus=8)
        submit(store, "a", "too-big", workers=8, gpus=8)  # 64 GPUs: pending for ever
        wait_for(lambda: store.get_job(None, running).state is JobState.STARTING, "admission")
        run_gang(plane, running)
        store.transition(running, JobState.RESTARTING, "control-loop", reason="rank 1 died")
        store.record_event(running, "job.straggler", "control-loop", {"rank": 1, "ratio": 3.0})
        store.record_event(
            running,
            "job.goodput",
            "control-loop",
            {"productive_seconds": 90.0, "wall_seconds": 100.0, "lost_seconds": 5.0},
        )
        SERVING.observe("a", "gpt", "v2", 0.02, ok=True)
        SERVING.observe("a", "gpt", "v2", 0.4, ok=False)
        SERVING.set_traffic("b", "bert", "v1", 1.0)
        wait_for(lambda: len(plane.queue()) == 1, "the queue to be published")
        yield RunningServer(url, plane, tokens)
    store.close()


def scrape(server: RunningServer, who: str | None) -> tuple[int, str]:
    with server.client(who) as client:
        client.get("/v1/jobs")  # some API traffic for the latency histogram
        response = client.get("/metrics")
    return response.status_code, response.text


def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    found: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        found[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return found


def test_metrics_need_a_token(server: RunningServer) -> None:
    status, text = scrape(server, None)
    assert status == 401 and "aicluster_" not in text
    with server.client() as client:
        bad = client.get("/metrics", headers={"Authorization": "Bearer aic_nope_nope"})
    assert bad.status_code == 401


def test_an_admin_sees_every_family_with_its_labels(server: RunningServer) -> None:
    status, text = scrape(server, "admin")
    assert status == 200
    found = families(text)
    jobs = {(s[1]["tenant"], s[1]["state"]): s[2] for s in found["aicluster_jobs"]}
    assert jobs[("a", "PENDING")] == 1 and jobs[("a", "RESTARTING")] == 1
    assert jobs[("b", "STARTING")] == 1 and jobs[("b", "FAILED")] == 0
    restarts = {s[1]["tenant"]: s[2] for s in found["aicluster_job_restarts"]}
    assert restarts == {"a": 1, "b": 0}
    assert {s[1]["tenant"]: s[2] for s in found["aicluster_queue_jobs"]} == {"a": 1}
    assert {s[1]["tenant"]: s[2] for s in found["aicluster_queue_gpus"]} == {"a": 64}
    (wait,) = found["aicluster_queue_wait_seconds_max"]
    assert wait[1] == {"tenant": "a"} and wait[2] >= 0
    allocated = {
        (s[1]["tenant"], s[1]["gpu_type"]): s[2] for s in found["aicluster_gpus_allocated"]
    }
    assert allocated == {("a", "H100"): 16, ("b", "H100"): 8}
    assert {s[1]["gpu_type"]: s[2] for s in found["aicluster_gpus_capacity"]} == {"H100": 32}
    assert {s[1]["health"]: s[2] for s in found["aicluster_nodes"]}["healthy"] == 4
    assert {s[1]["tenant"]: s[2] for s in found["aicluster_goodput_ettr"]} == {"a": 0.9}
    observed = {(s[1]["tenant"], s[1]["kind"]): s[2] for s in found["aicluster_job_observations"]}
    assert observed == {("a", "straggler"): 1}
    cycles = {s[0]: s[2] for s in found["aicluster_scheduling_cycle_seconds"]}
    assert cycles["aicluster_scheduling_cycle_seconds_count"] >= 1
    assert found["aicluster_scheduling_cycles"][0][2] >= 1
    routes = {(s[1]["method"], s[1]["route"]) for s in found["aicluster_api_request_seconds"]}
    assert ("GET", "/v1/jobs") in routes
    assert all("j-" not in route for _, route in routes)  # templates, never raw paths
    serving = {
        (s[0], tuple(sorted(s[1].items()))): s[2] for s in found["aicluster_serving_requests"]
    }
    assert (
        serving[
            (
                "aicluster_serving_requests_total",
                (("model", "gpt"), ("tenant", "a"), ("version", "v2")),
            )
        ]
        == 2
    )
    errors = {  # this test's model only: the process-wide registry may hold others' series
        s[1]["version"]: s[2]
        for s in found["aicluster_serving_errors"]
        if s[0].endswith("_total") and s[1]["model"] in ("gpt", "bert")
    }
    assert errors == {"v2": 1, "v1": 0}  # bert's v1 only has a traffic weight: 0 errors
    assert (
        "aicluster_serving_request_seconds" in found and "aicluster_serving_traffic_weight" in found
    )


def test_a_tenant_sees_only_its_own_series(server: RunningServer) -> None:
    status, text = scrape(server, "bob")
    assert status == 200
    found = families(text)
    tenants = {s[1].get("tenant") for samples in found.values() for s in samples}
    assert tenants == {"b"}
    for cluster_wide in ("aicluster_api_request_seconds", "aicluster_nodes", "aicluster_leader"):
        assert cluster_wide not in found
    assert {s[1]["tenant"]: s[2] for s in found["aicluster_gpus_allocated"]} == {"b": 8}
    assert "gpt" not in text and 'tenant="a"' not in text


def test_the_exposition_round_trips_and_passes_promtool(server: RunningServer) -> None:
    _, text = scrape(server, "admin")
    parsed = list(text_string_to_metric_families(text))
    names = {family.name for family in parsed}
    assert len(names) == len(parsed)  # one block per family
    assert all(name.startswith("aicluster_") for name in names)
    promtool = PROMTOOL if PROMTOOL.exists() else shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (make promtool unpacks it into .tools)")
    checked = subprocess.run(
        [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_the_grafana_dashboard_queries_only_exported_series(server: RunningServer) -> None:
    _, text = scrape(server, "admin")
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    dashboard = json.loads((DEPLOY / "grafana" / "aicluster.json").read_text())
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    assert len(queries) > 20
    used = {name for expr in queries for name in re.findall(r"aicluster_\w+", expr)}
    assert used - exported == set()
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    topics = ("tenant", "queue", "scheduling", "api", "restarts", "ettr", "model version", "power")
    topics += ("preemption",)
    for topic in topics:
        assert topic in titles, topic


def test_the_prometheus_config_is_valid(tmp_path: Path) -> None:
    promtool = PROMTOOL if PROMTOOL.exists() else shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (make promtool unpacks it into .tools)")
    token = tmp_path / "aicluster.token"
    token.write_text("aic_x_y\n")
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    copy = tmp_path / "prometheus.yml"
    copy.write_text(config.replace("/etc/prometheus/aicluster.token", str(token)))
    checked = subprocess.run(
        [str(promtool), "check", "config", str(copy)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
