"""Deployments' replicas as service jobs: the pure parts (what a version asks the scheduler
for, the spec of a replica, where the deployer runs replicas, Serve's options for them)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import pytest

from aicluster.configuration import ServingSection
from aicluster.core import JobState, ManualClock, Tenant
from aicluster.serve.deployer import Deployer, RayServe
from aicluster.serve.replica import deployment_options, service_scaling
from aicluster.serve.services import (
    DOWNSCALE_AFTER_S,
    ServiceScaler,
    replicas_for_load,
    service_replicas,
    service_spec,
    wanted_replicas,
)
from aicluster.store import JobRecord, Store
from aicluster.store.serving import DeploymentRecord, check_replica_host, check_scaling
from builders import service_job

#: A registered version's model.json without weights (the scaler never loads it).
STUB_MODEL = {"format": 1, "entrypoint": "m.py:load", "config": {}, "metrics": {}}
#: A deployment of team's gpt serving v1, as stored (the scaling is each test's).
DEPLOYED: dict[str, Any] = {
    "id": 1, "tenant": "team", "name": "gpt", "traffic": {1: 100.0}, "state": "active",
    "created_by": "u", "created_at": 0.0, "updated_at": 0.0, "version": 1,
}  # fmt: skip


def deployment(scaling: dict[str, Any], cpus: float = 1.0, memory_gb: float = 1.0) -> Any:
    """The deployment as stored (a :class:`DeploymentRecord`)."""
    return DeploymentRecord(
        scaling=check_scaling(scaling), cpus=cpus, memory_gb=memory_gb, **DEPLOYED
    )


@pytest.mark.parametrize(
    ("scaling", "wanted"),
    [
        ({"replicas": 3, "gpus": 1}, 3),
        ({"autoscaling": {"min": 2, "max": 5}, "gpus": 1}, 2),
        ({"autoscaling": {"min": 0, "max": 5}, "gpus": 1}, 1),  # never none: it could not serve
    ],
)
def test_a_version_asks_for_its_minimum_replicas(scaling: dict[str, Any], wanted: int) -> None:
    assert wanted_replicas(deployment(scaling)) == wanted


@pytest.mark.parametrize("gpus", [-1, 17, 1.5, True, "1"])
def test_a_bad_gpu_count_is_refused(gpus: Any) -> None:
    with pytest.raises(ValueError, match="gpus must be a whole number between 0 and 16"):
        check_scaling({"replicas": 1, "gpus": gpus})


def test_no_gpus_is_a_deployment_of_cpu_replicas() -> None:
    assert check_scaling({"replicas": 2, "gpus": 0}) == {"replicas": 2}
    record = deployment({"replicas": 2})
    assert record.gpus == 0 and wanted_replicas(record) == 2
    spec = service_spec(record, 1, ServingSection())
    assert (spec.resources.gpus, spec.resources.cpus, spec.resources.memory_gb) == (0, 1.0, 1.0)


@pytest.mark.parametrize(
    ("cpus", "memory_gb", "error"),
    [
        (0, 1.0, "cpus must be above 0"),
        (-1, 1.0, "cpus must be above 0"),
        (2000, 1.0, "cpus must be above 0 and at most 1024"),
        (float("nan"), 1.0, "cpus must be above 0"),
        (1.0, -0.5, "memory_gb must be between 0 and 16384"),
        (1.0, float("inf"), "memory_gb must be between 0"),
        (True, 1.0, "cpus must be a number"),
        (1.0, "2", "memory_gb must be a number"),
    ],
)
def test_bad_replica_cpus_or_memory_are_refused(cpus: Any, memory_gb: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        check_replica_host(cpus, memory_gb)


def test_a_replicas_spec_takes_the_configurations_priority_and_preemptibility() -> None:
    record = deployment({"replicas": 1, "gpus": 2}, cpus=2.5, memory_gb=4.0)
    spec = service_spec(record, 1, ServingSection(priority="high", preemptible=False))
    assert (spec.priority_value, spec.preemptible) == (300, False)
    assert (spec.workers, spec.resources.gpus, spec.max_domain) == (1, 2, "node")
    assert (spec.resources.cpus, spec.resources.memory_gb) == (2.5, 4.0)
    assert spec.tenant == "team" and spec.name == "svc-gpt.v1"
    long = replace(record, name="m" * 63)  # a job name has at most 63 characters
    assert len(service_spec(long, 12, ServingSection()).name) == 63


def test_replicas_run_where_running_service_jobs_were_placed() -> None:
    jobs = [
        service_job("j1", JobState.RUNNING, "node-1"),
        service_job("j2", JobState.RUNNING, "node-1"),
        service_job("j3", JobState.RUNNING, "node-2"),
        service_job("j4", JobState.PENDING, None),  # not admitted: no replica
        service_job("j5", JobState.PREEMPTING, "node-3"),  # being stopped: its replica goes
        service_job("j6", JobState.RUNNING, "node-0", version=2),
    ]
    placed = service_replicas(jobs)
    assert placed == {
        ("team", "gpt", 1): {"node-1": 2, "node-2": 1},
        ("team", "gpt", 2): {"node-0": 1},
    }


def test_serve_options_pin_gpu_replicas_to_their_nodes() -> None:
    placed = {"node-2": 1, "node-1": 2}
    scaling = service_scaling((1, 0.5, 2.0), placed, {"node-1": "aicluster/gpu"})
    options = deployment_options(scaling)
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    actor = options["ray_actor_options"]
    assert actor["resources"] == {"aicluster/gpu": 1.0}
    assert (actor["num_cpus"], actor["memory"]) == (0.5, 2.0 * (1 << 30))  # as the job holds
    assert actor["label_selector"] == {"aicluster.io/node": "in(node-1,node-2)"}
    assert options["max_replicas_per_node"] == 2
    even = deployment_options(service_scaling((1, 1.0, 1.0), {"node-1": 1, "node-2": 1}, {}))
    assert even["max_replicas_per_node"] == 1  # one each: exactly where the scheduler put them
    real = deployment_options(service_scaling((2, 1.0, 1.0), {"node-1": 1}, {"node-1": "GPU"}))
    assert real["ray_actor_options"]["num_gpus"] == 2.0
    assert real["ray_actor_options"]["label_selector"] == {"aicluster.io/node": "node-1"}
    assert "max_replicas_per_node" not in real


class Deployed:
    def __init__(self, records: list[DeploymentRecord], jobs: list[JobRecord]) -> None:
        self.records, self.jobs = records, jobs

    def list_deployments(self, tenant: str | None = None) -> list[DeploymentRecord]:
        return self.records

    def service_jobs(self) -> list[JobRecord]:
        return self.jobs


def deployer_of(store: Deployed, serve: Any) -> Deployer:
    return Deployer(
        store,
        serve,
        ManualClock(0.0),
        healthy=lambda record, version: False,
        artifact_dir=lambda tenant, name, version: Path("/models/gpt/1"),
    )


def test_the_deployer_runs_a_replica_per_admitted_service_job() -> None:
    serve = create_autospec(RayServe, instance=True)
    serve.applications.return_value = {}
    serve.gpu_resources.return_value = {"node-1": "aicluster/gpu"}
    store = Deployed(
        [deployment({"replicas": 1, "gpus": 1})], [service_job("j1", JobState.PENDING, None)]
    )
    deployer = deployer_of(store, serve)
    deployer.reconcile()
    assert serve.deploy.call_count == 0  # not admitted yet: no application (Serve refuses 0)
    store.jobs = [service_job("j1", JobState.RUNNING, "node-1")]
    deployer.reconcile()
    [call] = serve.deploy.call_args_list
    app, _, scaling, _ = call.args
    assert app == "aic-team.gpt.v1"
    assert scaling == {
        "replicas": 1,
        "gpus": 1,
        "cpus": 1.0,
        "memory_gb": 1.0,
        "nodes": {"node-1": 1},
        "gpu_resource": "aicluster/gpu",
    }


AUTO = {"autoscaling": {"min": 1, "max": 4, "target_ongoing_requests": 2.0}, "gpus": 1}


@pytest.mark.parametrize(
    ("rate", "latency_s", "wanted"),
    [
        (0.0, 0.0, 1),  # no traffic: the minimum
        (10.0, 0.2, 1),  # 2 in flight: one replica at its target
        (10.0, 0.3, 2),  # 3 in flight
        (20.0, 0.3 + 0.1, 4),  # 8 in flight
        (100.0, 1.0, 4),  # never above the maximum
        (20.0, 0.1 * 3, 3),  # 6.000000000000001 in flight is 6: three replicas, not four
    ],
)
def test_load_asks_for_replicas_by_littles_law(rate: float, latency_s: float, wanted: int) -> None:
    assert replicas_for_load(deployment(AUTO), rate, latency_s) == wanted


def test_the_scaler_grows_at_once_and_shrinks_after_the_load_stayed_low() -> None:
    load = {"rate": 20.0, "latency": 0.3}  # 6 in flight: 3 replicas
    scaler = ServiceScaler(None, lambda *key: (load["rate"], load["latency"]))
    record = deployment(AUTO)
    assert scaler.wanted(record, 1, now=100.0) == 3
    load["rate"] = 0.0
    assert scaler.wanted(record, 1, now=101.0) == 3  # lower load: not yet
    assert scaler.wanted(record, 1, now=100.0 + DOWNSCALE_AFTER_S) == 3
    assert scaler.wanted(record, 1, now=101.0 + DOWNSCALE_AFTER_S) == 1
    load["rate"] = 40.0  # 12 in flight, capped at 4, at once
    assert scaler.wanted(record, 1, now=102.0 + DOWNSCALE_AFTER_S) == 4
    fixed = deployment({"replicas": 2, "gpus": 1})  # no range: the load is not asked
    assert scaler.wanted(fixed, 1, now=200.0) == 2


def test_the_deployer_pins_a_cpu_replica_to_its_node_with_what_its_job_holds() -> None:
    serve = create_autospec(RayServe, instance=True)
    serve.applications.return_value = {}
    record = deployment({"replicas": 1}, cpus=2.0, memory_gb=0.0)
    store = Deployed([record], [service_job("j1", JobState.RUNNING, "node-3")])
    deployer = deployer_of(store, serve)
    deployer.reconcile()
    [call] = serve.deploy.call_args_list
    scaling = call.args[2]
    assert scaling == {
        "replicas": 1, "gpus": 0, "cpus": 2.0, "memory_gb": 0.0, "nodes": {"node-3": 1}
    }  # fmt: skip
    serve.gpu_resources.assert_not_called()  # no GPU: no resource to count them in
    actor = deployment_options(scaling)["ray_actor_options"]
    assert actor == {"num_cpus": 2.0, "label_selector": {"aicluster.io/node": "node-3"}}


def store_with_model(tmp_path: Path) -> Store:
    """A real store with tenant ``team`` and version 1 of its model ``gpt``."""
    store = Store.open(tmp_path / "state")
    store.create_tenant(Tenant("team"), "test")
    source = tmp_path / "gpt-1"
    source.mkdir()
    (source / "model.json").write_text(json.dumps(STUB_MODEL))
    store.register_model_version(
        "team", "gpt", source_dir=source, job_id=None, spec_hash=None, code_version="c" * 64,
        dataset_hash=None, metrics={}, registered_by="test",
    )  # fmt: skip
    return store


def test_the_scaler_asks_the_scheduler_for_a_cpu_deployments_replicas(tmp_path: Path) -> None:
    """A CPU deployment's replicas are service jobs too, against a real store: as many as its
    load needs by Little's law (within its range), each asking the deployment's CPUs and
    memory and no GPU, and replaced when the deployment asks other CPUs."""
    store = store_with_model(tmp_path)
    load = {"rate": 0.0, "latency": 0.1}
    scaler = ServiceScaler(store, lambda *key: (load["rate"], load["latency"]))
    auto = {"autoscaling": {"min": 1, "max": 3, "target_ongoing_requests": 1.0}}

    def live() -> list[tuple[int, float, float]]:
        jobs = [j for j in store.service_jobs() if j.cancel_requested_at is None]
        return sorted(
            (j.spec.resources.gpus, j.spec.resources.cpus, j.spec.resources.memory_gb) for j in jobs
        )

    store.put_deployment("team", "gpt", auto, {1: 100.0}, "alice", cpus=0.5, memory_gb=2.0)
    scaler.reconcile(0.0)
    assert live() == [(0, 0.5, 2.0)]  # no load: the minimum, no GPU
    load["rate"] = 25.0  # 2.5 requests in flight, a target of 1 each: 3 replicas
    scaler.reconcile(1.0)
    assert live() == [(0, 0.5, 2.0)] * 3
    job = store.service_jobs()[0]
    assert (job.kind, job.tenant) == ("service", "team")
    assert job.service == {"model": "gpt", "version": 1}
    store.put_deployment("team", "gpt", auto, {1: 100.0}, "alice", cpus=1.5, memory_gb=2.0)
    scaler.reconcile(2.0)
    assert live() == [(0, 1.5, 2.0)] * 3  # other CPUs per replica: every job replaced
    store.close()


def test_the_configuration_sets_how_long_a_lower_load_waits_to_give_a_replica_back(
    tmp_path: Path,
) -> None:
    store = store_with_model(tmp_path)
    store.apply_config("serving:\n  scale_down_after_s: 5\n", "test.yaml", "admin")
    load = {"rate": 25.0, "latency": 0.1}  # 2.5 in flight: 3 replicas
    scaler = ServiceScaler(store, lambda *key: (load["rate"], load["latency"]))
    auto = {"autoscaling": {"min": 1, "max": 3, "target_ongoing_requests": 1.0}}
    store.put_deployment("team", "gpt", auto, {1: 100.0}, "alice", cpus=0.5, memory_gb=1.0)

    def live() -> int:
        return sum(j.cancel_requested_at is None for j in store.service_jobs())

    scaler.reconcile(0.0)
    assert live() == 3
    load["rate"] = 0.0
    scaler.reconcile(1.0)  # the load is lower from here
    scaler.reconcile(5.9)
    assert live() == 3
    scaler.reconcile(6.0)  # 5 s of it: given back (the default would wait 30)
    assert live() == 1
    store.close()
