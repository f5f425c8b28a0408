"""A rank per GPU, on an embedded cluster of 2 nodes x 4 simulated GPUs in NVLink domains of 2,
with the control plane sandboxing every rank (real CLI submissions from the jobs' folders).

``examples/jobs/gpt_hybrid.yaml`` (2 workers x 2 GPUs, data 2 x tensor 2) runs beside another
tenant's job that holds 2 GPUs of each node: 4 ranks on 2 nodes, each with its own GPU index
inside one NVLink domain, none of the other job's. Then data 4 x tensor 2 fills the 8 GPUs. In
both, each tensor-parallel group's ranks (``train.mesh()``: tp innermost, so consecutive ranks)
report the same node and NVLink domain. Pipeline 2 x data 2 on 2 workers x 2 GPUs trains too.
That the scheduler refuses a placement splitting a tensor-parallel group over domains is
``test_tensor_parallel_groups_stay_in_one_nvlink_domain`` in
``tests/unit/test_scheduler_placement.py``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serverproc import SANDBOX_REQUIRED, ServerProcess, sandboxed_server

from aicluster.runtime import RunDir, embedded_topology, start_detached, stop_detached
from aicluster.train.telemetry import StepRecord

pytestmark = [pytest.mark.integration, SANDBOX_REQUIRED]

REPO = Path(__file__).resolve().parents[2]
HOLD = Path(__file__).parent / "rank_job" / "hold.yaml"
TENANTS = {"team-a": {"quota": {"sim-gpu": 8}}, "team-b": {"quota": {"sim-gpu": 8}}}
STEPS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("rank-per-gpu")
    topology = embedded_topology(nodes=2, gpus_per_node=4, nvlink_domain_size=2)
    started = start_detached(work / "ray", topology)
    try:
        with sandboxed_server("ranks", started.address, work, TENANTS) as running:
            yield running
    finally:
        stop_detached(work / "ray")


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of examples/ whose gpt_hybrid specs train for a few steps only."""
    copy = tmp_path_factory.mktemp("examples") / "examples"
    shutil.copytree(REPO / "examples", copy, ignore=shutil.ignore_patterns("__pycache__"))
    spec = copy / "jobs" / "gpt_hybrid.yaml"
    text = spec.read_text().replace('"--steps", "20"', f'"--steps", "{STEPS}"')
    spec.write_text(text)
    wider = text.replace("workers: 2", "workers: 4").replace("data: 2", "data: 4")
    (copy / "jobs" / "gpt_hybrid_dp4.yaml").write_text(wider)
    staged = text.replace("tensor: 2", "pipeline: 2")
    (copy / "jobs" / "gpt_hybrid_pp2.yaml").write_text(staged)
    return copy / "jobs"


def finished(server: ServerProcess, job_id: str, timeout_s: float = 420) -> dict[str, Any]:
    server.wait_for(
        lambda: server.job(job_id)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
        timeout_s,
        f"{job_id} to end",
    )
    return server.job(job_id)


def placed_ranks(server: ServerProcess, job_id: str, ranks: int) -> list[tuple[str, int, int]]:
    """(node, GPU index, NVLink domain) of each rank, as its start record reports them (what
    the rank's environment said), checked against what the launcher recorded."""
    run = RunDir(server.state_dir, job_id, server.job(job_id)["attempt"])
    seen = []
    for rank in range(ranks):
        start = next(r for r in run.telemetry(rank) if r.kind == "start")
        assert start.metrics["world_size"] == ranks
        seen.append(
            (
                str(start.node),
                int(start.metrics["device_index"]),
                int(start.metrics["nvlink_domain"]),
            )
        )
    recorded = (run.spec() or {})["ranks"]
    assert [(r["node"], r["device"], r["nvlink_domain"]) for r in recorded] == seen
    return seen


def assert_tensor_groups_in_one_domain(placed: list[tuple[str, int, int]], tensor: int) -> None:
    assert len(set((node, device) for node, device, _ in placed)) == len(placed)  # a GPU each
    for start in range(0, len(placed), tensor):
        group = placed[start : start + tensor]
        assert len({(node, domain) for node, _, domain in group}) == 1, placed
        assert all(device // 2 == domain for _, device, domain in group), placed


def trained(server: ServerProcess, job_id: str, mesh: str) -> None:
    """The job SUCCEEDED, rank 0 printed ``mesh`` and its loss fell over its steps."""
    job = finished(server, job_id)
    assert job["state"] == "SUCCEEDED", job
    run = RunDir(server.state_dir, job_id, job["attempt"])
    assert mesh in run.read_log(0, "stdout", 0, 1 << 20).text
    records: list[StepRecord] = run.telemetry(0)
    seen = [r.loss for r in records if r.kind == "step" and r.loss is not None]
    assert len(seen) == STEPS and seen[-1] < seen[0] - 0.5, seen


def test_gpt_hybrid_runs_a_rank_per_gpu_beside_another_job(
    server: ServerProcess, examples: Path
) -> None:
    alice, bob = server.create_member("alice", "team-a"), server.create_member("bob", "team-b")
    holder = server.submit(bob, HOLD)
    server.wait_for(lambda: server.job(holder)["state"] == "RUNNING", 180, "the holder to run")
    server.wait_for(
        lambda: all(RunDir(server.state_dir, holder, 1).telemetry(rank) for rank in range(4)),
        120,
        "the holder's ranks to start",
    )
    held = placed_ranks(server, holder, 4)
    assert sorted({node for node, _, _ in held}) == ["node-0", "node-1"]

    job_id = server.submit(alice, examples / "gpt_hybrid.yaml")
    trained(server, job_id, "'dp': 2, 'pp': 1, 'tp': 2")
    with server.client(alice) as client:  # why it started: the mesh the scheduler chose
        events = client.get(f"/v1/jobs/{job_id}/events").json()
    mesh = "mesh dp=2 x pp=1 x tp=2, each tensor-parallel group in one NVLink domain"
    assert any(mesh in str(event["details"]) for event in events), events
    placed = placed_ranks(server, job_id, 4)
    assert sorted({node for node, _, _ in placed}) == ["node-0", "node-1"]  # 2 nodes x 2 GPUs
    assert_tensor_groups_in_one_domain(placed, tensor=2)
    assert not {(node, device) for node, device, _ in held} & {(n, d) for n, d, _ in placed}

    server.cli(bob, "cancel", holder)
    finished(server, holder, timeout_s=120)


def test_data_4_by_tensor_2_fills_both_nodes_with_tensor_groups_inside_domains(
    server: ServerProcess, examples: Path
) -> None:
    alice = server.create_member("alice2", "team-a")
    job_id = server.submit(alice, examples / "gpt_hybrid_dp4.yaml")
    trained(server, job_id, "'dp': 4, 'pp': 1, 'tp': 2")
    placed = placed_ranks(server, job_id, 8)
    assert sorted(placed) == sorted(
        (node, device, device // 2) for node in ("node-0", "node-1") for device in range(4)
    )
    assert_tensor_groups_in_one_domain(placed, tensor=2)


def test_two_pipeline_stages_by_two_data_parallel_ranks_train(
    server: ServerProcess, examples: Path
) -> None:
    alice = server.create_member("alice3", "team-a")
    job_id = server.submit(alice, examples / "gpt_hybrid_pp2.yaml")
    trained(server, job_id, "'dp': 2, 'pp': 2, 'tp': 1")
    assert len(set(placed_ranks(server, job_id, 4))) == 4
