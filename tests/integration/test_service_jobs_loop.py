"""Service jobs in the live control loop, without Ray: a real store and a real loop (the
runtime boundary of :mod:`liveplane`). A service job is admitted like any gang and RUNNING
without a gang; preempted, it goes back to PENDING like any job; cancelled, it ends; a
draining node's service job is moved like a training gang. (The Ray side, Serve replicas on
the scheduler's nodes, is ``test_service_gangs.py``.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from liveplane import leading, open_live_plane, run_gang, submit, wait_for
from stubmodels import register_stubs

from aicluster.core import (
    DomainLevel,
    JobState,
    Node,
    Placement,
    Slot,
    Tenant,
    jobspec_from_mapping,
)
from aicluster.serve.services import ServiceScaler
from aicluster.store import JobRecord, NodeHealth, Store

pytestmark = pytest.mark.integration


def submit_service(store: Store, priority: str, gpus: int = 1, preemptible: bool = True) -> str:
    spec = jobspec_from_mapping(
        {
            "name": "svc-m.v1",
            "module": "aicluster.serve.replica",
            "resources": {"gpus": gpus, "gpu_type": "H100"},
            "priority": priority,
            "preemptible": preemptible,
            "max_domain": "node",
        }
    )
    job, _ = store.submit_job("t", spec, "serving", service={"model": "m", "version": 1})
    return job.id


def state_of(store: Store, job_id: str) -> JobState:
    return store.get_job(None, job_id).state


def test_a_service_job_runs_without_a_gang_and_is_preempted_like_any_job(tmp_path: Path) -> None:
    nodes = [
        Node("node-0", 2, "H100", "rack-0", "pod-0"),
        Node("node-1", 2, "H100", "rack-0", "pod-0"),
    ]
    plane = open_live_plane(tmp_path, [Tenant("t")], nodes)
    store = plane.store
    with leading(plane):
        batch = [submit(store, "t", f"batch-{i}", workers=1, gpus=2) for i in range(2)]
        for job_id in batch:
            wait_for(lambda j=job_id: store.get_job(None, j).placement is not None, "placed")
            run_gang(plane, job_id)
        service = submit_service(store, "high")
        wait_for(lambda: state_of(store, service) is JobState.RUNNING, "the service to run")
        record = store.get_job(None, service)
        assert record.is_service and record.attempt == 1
        assert not (tmp_path / "runs" / service).exists()  # no gang was launched for it
        # It took a batch job's node: that job was preempted and waits in the queue again.
        wait_for(
            lambda: sorted(state_of(store, j).value for j in batch) == ["PENDING", "RUNNING"],
            "a batch job to be preempted",
        )
        [victim] = [j for j in batch if state_of(store, j) is JobState.PENDING]
        kinds = [(e.from_state, e.to_state) for e in store.events(victim)]
        assert ("RUNNING", "PREEMPTING") in kinds and ("PREEMPTING", "PENDING") in kinds

        # A normal-priority service preempts nothing: it waits, with a reason.
        waiting = submit_service(store, "normal")
        wait_for(lambda: store.get_job(None, waiting).pending_reason is not None, "a reason")
        assert state_of(store, waiting) is JobState.PENDING

        # A draining node's service job is moved like a gang: stopped, queued again, and
        # placed on the other node (where it preempts the batch job left).
        assert record.placement is not None
        node = str(record.placement["slots"][0][0])
        store.set_node_health(node, NodeHealth.DRAINING, "test", "maintenance")

        def moved() -> bool:
            now = store.get_job(None, service)
            return now.state is JobState.RUNNING and now.attempt == 2

        wait_for(moved, "the service to move off the draining node")
        placement = store.get_job(None, service).placement
        assert placement is not None and placement["slots"][0][0] != node
        steps = [(e.from_state, e.to_state) for e in store.events(service)]
        assert ("PREEMPTING", "PENDING") in steps

        store.cancel_job("t", service, "serving", reason="fewer replicas wanted")
        wait_for(lambda: state_of(store, service) is JobState.CANCELLED, "the cancel")
    store.close()


def test_a_service_that_is_not_preemptible_keeps_its_gpu(tmp_path: Path) -> None:
    """Services preempt batch, never the reverse: a critical batch job waits for the GPU a
    non-preemptible service holds."""
    plane = open_live_plane(tmp_path, [Tenant("t")], [Node("node-0", 1, "H100", "r", "p")])
    store = plane.store
    with leading(plane):
        service = submit_service(store, "high", preemptible=False)
        wait_for(lambda: state_of(store, service) is JobState.RUNNING, "the service to run")
        spec = jobspec_from_mapping(
            {
                "name": "urgent",
                "entrypoint": "train.py",
                "resources": {"gpus": 1, "gpu_type": "H100"},
                "priority": "critical",
            }
        )
        urgent, _ = store.submit_job("t", spec, "test")
        wait_for(lambda: store.get_job(None, urgent.id).pending_reason is not None, "a reason")
        time.sleep(1.0)  # several cycles of the loop (every 0.2 s): still no preemption
        assert state_of(store, service) is JobState.RUNNING
        assert state_of(store, urgent.id) is JobState.PENDING
    store.close()


def test_the_service_scaler_keeps_each_versions_jobs_as_wanted(tmp_path: Path) -> None:
    """Against a real store: jobs are asked for, given back (queued ones first), replaced when
    the GPU count changes (a CPU deployment's replicas are jobs too), and cancelled with their
    version or deployment; the configuration's ``serving:`` section gives their priority."""
    store = Store.open(tmp_path / "state")
    store.create_tenant(Tenant("t"), "test")
    register_stubs(store, "t", "m", tmp_path, 2)
    store.apply_config("serving:\n  priority: critical\n", "serving.yaml", "admin")
    scaler = ServiceScaler(store)

    def live(version: int | None = None) -> list[JobRecord]:
        jobs = store.service_jobs()
        return [j for j in jobs if version is None or (j.service or {})["version"] == version]

    store.put_deployment("t", "m", {"replicas": 3, "gpus": 1}, {1: 100.0}, "alice")
    scaler.reconcile(0.0)
    scaler.reconcile(1.0)  # idempotent: nothing more asked for
    first = live()
    assert len(first) == 3 and {j.priority for j in first} == {400}
    assert {(j.kind, j.submitted_by, j.spec.resources.gpus) for j in first} == {
        ("service", "serving", 1)
    }
    placed = first[0]
    store.start_jobs([(placed.id, _placement("node-0"), "test")], "test")

    store.put_deployment("t", "m", {"replicas": 2, "gpus": 1}, {1: 100.0}, "alice")
    scaler.reconcile(2.0)
    assert [j.id for j in live()] == [placed.id, first[1].id]  # the newest queued one went
    store.put_deployment("t", "m", {"replicas": 1, "gpus": 1}, {1: 100.0}, "alice")
    scaler.reconcile(2.5)
    assert [j.id for j in live()] == [placed.id]  # a queued one before a placed one

    store.put_deployment("t", "m", {"replicas": 1, "gpus": 2}, {1: 80.0, 2: 20.0}, "alice")
    scaler.reconcile(3.0)
    now = live()
    assert store.get_job(None, placed.id).cancel_requested_at is not None  # asks 1 GPU: stale
    fresh = [j for j in now if j.cancel_requested_at is None]
    assert sorted((j.service or {})["version"] for j in fresh) == [1, 2]
    assert {j.spec.resources.gpus for j in fresh} == {2}

    store.put_deployment("t", "m", {"replicas": 1}, {2: 100.0}, "alice")  # no GPUs any more
    scaler.reconcile(4.0)
    [cpu] = [j for j in live() if j.cancel_requested_at is None]  # a CPU replica, as a job too
    assert (cpu.service, cpu.spec.resources.gpus, cpu.spec.resources.cpus) == (
        {"model": "m", "version": 2}, 0, 1.0
    )  # fmt: skip
    store.delete_deployment("t", "m", "alice")
    scaler.reconcile(5.0)
    assert [j for j in live() if j.cancel_requested_at is None] == []
    store.close()


def _placement(node: str) -> Placement:
    return Placement(slots=(Slot(node, 1, 0),), level=DomainLevel.NODE, domain=node)
