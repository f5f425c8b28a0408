"""The scheduler configuration file, live: ``GET/PUT /v1/config``, ``aicluster config``, and a
control loop that runs whichever policy was applied (its queue order follows it).

One plane for the module: a real store and a real control loop (no Ray: the runtime boundary of
:mod:`liveplane`), following the configuration applied in the store as a server's loop does. One
GPU is held by a job that nothing may preempt, so the other jobs wait in the policy's order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from apiserver import TLS, serve
from liveplane import leading, open_live_plane, run_gang, users, wait_for
from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.control import ControlPlane
from aicluster.core import JobState, Node, Tenant, jobspec_from_mapping
from aicluster.scheduler import names
from aicluster.server import apply_config_file
from aicluster.server import main as server_main
from aicluster.store import Role

pytestmark = pytest.mark.integration

TENANTS = [Tenant("team-a"), Tenant("team-b")]
GRANTS = {"alice": ("team-a", Role.MEMBER), "bob": ("team-b", Role.MEMBER)}

#: The waiting jobs, in submission order: (name, tenant, priority, duration estimate in s).
WAITING = [
    ("early-long", "team-a", 0, 7200),
    ("urgent", "team-a", 50, 3600),
    ("quick", "team-a", 0, 30),
    ("late-b", "team-b", 0, 1800),
]
#: The queue order each policy gives them. The blocker (team-a) holds the only GPU, so fair
#: share puts team-b first; Tiresias' jobs have attained nothing, so it queues by arrival.
EXPECTED = {
    "fifo": ["early-long", "urgent", "quick", "late-b"],
    "priority": ["urgent", "early-long", "quick", "late-b"],
    "sjf": ["quick", "late-b", "urgent", "early-long"],
    "srtf": ["quick", "late-b", "urgent", "early-long"],
    "tiresias": ["early-long", "urgent", "quick", "late-b"],
    "fair": ["late-b", "urgent", "early-long", "quick"],
}


def submit(plane: ControlPlane, name: str, tenant: str, priority: int, estimate: float) -> str:
    spec = jobspec_from_mapping(
        {
            "name": name,
            "entrypoint": "train.py",
            "resources": {"gpus": 1, "gpu_type": "H100"},
            "priority": priority,
            "duration_estimate": estimate,
            "preemptible": name != "blocker",
        }
    )
    job, _ = plane.store.submit_job(tenant, spec, "test")
    return job.id


class Live:
    def __init__(self, plane: ControlPlane, url: str, tokens: dict[str, str]) -> None:
        self.plane, self.url, self.tokens = plane, url, tokens

    def client(self, who: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[who]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, verify=TLS)

    def apply(self, who: str, text: str, source: str = "test.yaml") -> httpx.Response:
        with self.client(who) as client:
            return client.put(
                "/v1/config",
                params={"source": source},
                content=text.encode(),
                headers={"Content-Type": "application/yaml"},
            )

    def shown(self, who: str = "admin") -> dict[str, Any]:
        with self.client(who) as client:
            response = client.get("/v1/config")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def queue_names(self) -> list[str]:
        with self.client("admin") as client:
            return [entry["name"] for entry in client.get("/v1/queue").json()]

    def cli(self, who: str, *args: str) -> Any:
        options = ["--url", self.url, "--token", self.tokens[who]]
        return CliRunner().invoke(app, [*args, *options], env={"COLUMNS": "80"})


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    state = tmp_path_factory.mktemp("config-state")
    node = Node("node-0", 1, "H100", "rack-0", "pod-0")
    plane = open_live_plane(state, TENANTS, [node], follow_config=True)
    tokens = users(plane.store, GRANTS)
    with leading(plane), serve(plane) as url:
        blocker = submit(plane, "blocker", "team-a", 0, 10**6)
        wait_for(lambda: plane.store.get_job(None, blocker).placement is not None, "the blocker")
        run_gang(plane, blocker)
        for name, tenant, priority, estimate in WAITING:
            submit(plane, name, tenant, priority, estimate)
            time.sleep(0.01)  # distinct submission times
        found = Live(plane, url, tokens)
        wait_for(lambda: len(found.queue_names()) == len(WAITING), "the jobs to queue")
        yield found
    plane.store.close()


def test_with_nothing_applied_the_documented_defaults_are_live(live: Live) -> None:
    shown = live.shown("alice")
    if shown["id"] == 0:  # before any other test applied one
        assert shown["policy"] == "fair"
        assert shown["configuration"]["preemption"]["grace_period_s"] == 10.0


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_the_live_loop_runs_the_policy_applied(live: Live, policy: str) -> None:
    response = live.apply("admin", f"policy:\n  name: {policy}\n", f"{policy}.yaml")
    assert response.status_code == 200, response.text
    assert response.json()["policy"] == policy
    assert live.shown("bob")["policy"] == policy  # every user may read it
    loop = live.plane.loop
    assert loop is not None
    wait_for(lambda: loop.config.queue == policy, f"the loop to run {policy}")
    wait_for(lambda: live.queue_names() == EXPECTED[policy], f"the {policy} order", timeout=10)
    blocker = [job for job in live.plane.store.active_jobs() if job.spec.name == "blocker"]
    assert blocker and blocker[0].state is JobState.RUNNING  # no job dropped or preempted


def test_every_policy_is_covered() -> None:
    assert sorted(EXPECTED) == names()
    assert len({tuple(order) for order in EXPECTED.values()}) >= 4  # the orders tell them apart


def test_a_bad_file_changes_nothing_and_names_key_and_line(live: Live) -> None:
    assert live.apply("admin", "policy:\n  name: sjf\n").status_code == 200
    before = live.shown()
    bad = "policy:\n  name: sjf\npreemption:\n  grace_period_s: -1\n"
    response = live.apply("admin", bad, "bad.yaml")
    assert response.status_code == 400
    assert "bad.yaml:4" in response.text and "preemption.grace_period_s" in response.text
    for text in ("policy: [", "policy:\n  name: lottery\n", "backfill: sometimes\n", "- 1\n"):
        assert live.apply("admin", text).status_code == 400, text
    assert live.shown() == before
    time.sleep(0.5)  # a few ticks
    assert live.plane.loop is not None and live.plane.loop.config.queue == "sjf"


def test_only_cluster_admins_apply_and_members_see_only_their_quotas(live: Live) -> None:
    before = live.shown()
    assert live.apply("alice", "policy:\n  name: fifo\n").status_code == 403
    assert live.shown() == before
    assert [t["name"] for t in live.shown("alice")["tenants"]] == ["team-a"]
    assert [t["name"] for t in live.shown("bob")["tenants"]] == ["team-b"]
    assert {t["name"] for t in live.shown("admin")["tenants"]} == {"team-a", "team-b"}


def test_the_cli_applies_and_shows(live: Live, tmp_path: Path) -> None:
    good = tmp_path / "tiresias.yaml"
    good.write_text("policy:\n  name: tiresias\n  tiresias:\n    thresholds_gpu_s: [60, 600]\n")
    result = live.cli("admin", "config", "apply", str(good))
    assert result.exit_code == 0, result.output
    assert "policy tiresias" in result.output
    shown = live.cli("bob", "config", "show")
    assert shown.exit_code == 0, shown.output
    assert "# policy: tiresias" in shown.output
    document = yaml.safe_load(shown.output)
    assert document["policy"]["tiresias"]["thresholds_gpu_s"] == [60.0, 600.0]
    assert [t["name"] for t in document["tenants"]] == ["team-b"]
    as_json = live.cli("bob", "config", "show", "-o", "json")
    assert as_json.exit_code == 0 and '"policy": "tiresias"' in as_json.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("health:\n  straggler_factor: 0.5\n")
    refused = live.cli("admin", "config", "apply", str(bad))
    assert refused.exit_code == 2
    assert "bad.yaml:2" in refused.output and "health.straggler_factor" in refused.output
    assert "Traceback" not in refused.output
    assert live.shown()["policy"] == "tiresias"


def test_up_config_applies_once_and_seeds_only_missing_tenants(live: Live, tmp_path: Path) -> None:
    store = live.plane.store
    store.put_tenant(Tenant("team-a", quota={"H100": 1}), "test")
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "policy:\n  name: priority\n"
        "tenants:\n  - name: team-a\n    quota: {H100: 9}\n  - name: team-c\n    weight: 2\n"
    )
    apply_config_file(store, path)
    first = store.current_config()
    apply_config_file(store, path)  # a restart with the same file
    assert store.current_config() == first and first is not None
    tenants = {tenant.name: tenant for tenant in store.list_tenants()}
    assert tenants["team-a"].quota == {"H100": 1}  # `tenants set` wins over the seed
    assert tenants["team-c"].weight == 2
    store.delete_tenant("team-c", "test")
    store.put_tenant(Tenant("team-a"), "test")


def test_a_server_refuses_a_bad_config_before_it_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("preemption:\n  enabled: true\n  max_victims: 0\n")
    state = tmp_path / "state"
    argv = ["--state-dir", str(state), "--insecure-no-sandbox", "--config", str(bad)]
    assert server_main(argv) == 2
    assert not (state / "server.json").exists()


@pytest.mark.parametrize(
    ("resources", "named"),
    [
        ({"gpus": 1, "cpus": 100}, "needs 100 CPUs on one node; the largest node has 64"),
        ({"gpus": 0, "memory_gb": 1000}, "1000 GB of memory on one node; the largest node has 512"),
        ({"gpus": 2}, "a worker needs 2 GPUs on one node; the largest node has 1"),
        ({"gpus": 1, "gpu_type": "A100"}, "no node has GPU type A100"),
    ],
)
def test_a_job_no_node_could_ever_hold_is_refused_at_submit_naming_the_resource(
    live: Live, resources: dict[str, Any], named: str
) -> None:
    spec = {"name": "too-big", "module": "train", "resources": resources}
    with live.client("alice") as client:
        before = _job_ids(client)
        response = client.post("/v1/jobs", json=spec)
        assert response.status_code == 400, response.text
        assert named in response.text, response.text
        # Nothing stored. Compared by id: the scheduler rewrites other jobs' pending reasons.
        assert _job_ids(client) == before


def _job_ids(client: Any) -> set[str]:
    return {job["id"] for job in client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]}


def test_a_job_without_gpus_that_fits_is_taken(live: Live) -> None:
    spec = {"name": "cpu-only", "module": "train", "resources": {"gpus": 0, "cpus": 2}}
    with live.client("alice") as client:
        response = client.post("/v1/jobs", json=spec)
        assert response.status_code == 201, response.text
        assert client.post(f"/v1/jobs/{response.json()['id']}/cancel").status_code == 200
