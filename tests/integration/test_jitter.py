"""Jitter and stragglers of a job that knows nothing of aicluster: an unmodified DDP script
(``jobs/ddp_plain.py``, gloo, 2 ranks on 2 nodes of the real Ray cluster) whose rank 1 sleeps
0.2 s per step. The launcher's step timing shim reports compute time and collective wait; the
control loop flags rank 1 and its node within 20 steps; jitter shows on ``/metrics`` (checked by
promtool), the job page, ``why`` and ``jobs``. Plus the shim on its own: a script that reports
through ``aicluster.train`` is not reported twice, and a script without torch runs as with
``python``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apiserver import RunningServer, serve, users
from prometheus_client.parser import text_string_to_metric_families
from shipping import JOBS, ship
from typer.testing import CliRunner

from aicluster.api import ServerSettings
from aicluster.cli.main import app
from aicluster.control import ControlPlane
from aicluster.control.loop.loop import ControlLoop
from aicluster.control.settings import LoopSettings
from aicluster.core import JobState, Tenant, jobspec_from_mapping
from aicluster.runtime import Runtime, discover
from aicluster.runtime.warm import starter as warm
from aicluster.scheduler import SchedulerConfig
from aicluster.store import Store
from aicluster.store.base import WallClock
from warmprocs import OWN, start_zygote

pytestmark = pytest.mark.integration

PROMTOOL = Path(__file__).resolve().parents[2] / ".tools/prometheus/usr/bin/promtool"
SHIM = Path(__file__).resolve().parents[2] / "src/aicluster/runtime/gang/_steptime.py"


def metric_samples(text: str, family: str, job_id: str) -> dict[tuple[str, ...], float]:
    found = {}
    for parsed in text_string_to_metric_families(text):
        if parsed.name == family:
            for sample in parsed.samples:
                if sample.labels.get("job") == job_id:
                    labels = {k: v for k, v in sample.labels.items() if k not in ("job", "tenant")}
                    found[tuple(f"{k}={v}" for k, v in sorted(labels.items()))] = sample.value
    return found


def ray_load() -> dict[str, object]:
    """What Ray has free and in use now: why a job of this test would wait."""
    import ray

    return {"available": ray.available_resources(), "total": ray.cluster_resources()}


def test_an_unmodified_ddp_straggler_is_flagged_and_its_jitter_exported(
    runtime: Runtime, tmp_path: Path
) -> None:
    store = Store.open(tmp_path)
    store.create_tenant(Tenant("a"), "test")
    settings = LoopSettings(SchedulerConfig(queue="priority"), stop_grace_s=3)
    loop = ControlLoop(store, runtime, discover, WallClock(), settings)
    settings = ServerSettings(state_dir=tmp_path)
    plane = ControlPlane(settings=settings, store=store, clock=WallClock(), runtime=runtime)
    plane.loop = loop  # ticked by this test, not by a thread
    spec = jobspec_from_mapping(
        {
            "name": "ddp-plain",
            "entrypoint": "ddp_plain.py",
            "code": ship(runtime.state_dir, "a", JOBS),
            "workers": 2,
            "args": ["--steps", "70", "--slow-rank", "1", "--sleep", "0.2"],
            # Over half a node's 8 CPUs each: the 2 ranks (a GPU each) run on 2 nodes, also
            # beside what an earlier test of the session's cluster still holds (a CPU or two).
            "resources": {"gpus": 1, "cpus": 5, "memory_gb": 0.1},
        }
    )
    job, _ = store.submit_job("a", spec, "tester")
    tokens = users(store, {})
    try:
        with serve(plane) as url:
            server = RunningServer(url, plane, tokens)
            event = None
            deadline = time.monotonic() + 150
            while event is None:
                record = store.get_job(None, job.id)
                waiting = (record.state, record.pending_reason, ray_load())
                assert time.monotonic() < deadline, waiting
                assert not store.get_job(None, job.id).state.terminal, "ended unflagged"
                loop.tick()
                flagged = [e for e in store.events(job.id) if e.kind == "job.straggler"]
                event = flagged[0] if flagged else None
                time.sleep(0.3)
            # Rank 1 and the node it runs on (as its own telemetry says), by step 20.
            ranks = plane.telemetry(store.get_job(None, job.id))
            slow_node = next(r["node"] for r in ranks["1"] if r.get("node"))
            fast_node = next(r["node"] for r in ranks["0"] if r.get("node"))
            assert slow_node != fast_node
            assert event.details["rank"] == 1 and event.details["node"] == slow_node
            assert event.details["step"] <= 20 and event.details["ratio"] > 1.3
            waits = [r["metrics"]["comm_wait"] for r in ranks["0"] if "metrics" in r]
            assert waits and max(waits) > 0.1  # rank 0 waited for rank 1 in the all-reduce

            with server.client("admin") as client:
                text = client.get("/metrics").text
                why = client.get(f"/v1/jobs/{job.id}/why").json()
                listed = client.get("/v1/jobs").json()["jobs"]
                page = client.get(f"/v1/ui/jobs/{job.id}").json()
            jitter = metric_samples(text, "aicluster_job_sync_jitter_seconds", job.id)
            assert 0.1 < jitter[()] < 0.4
            per_node = metric_samples(text, "aicluster_node_sync_jitter_seconds", job.id)
            assert per_node[(f"node={slow_node}",)] > 0.1
            assert per_node[(f"node={fast_node}",)] < 0.05
            ratio = metric_samples(text, "aicluster_job_straggler_ratio", job.id)
            assert list(ratio) == [(f"node={slow_node}", "rank=1")]
            promtool = PROMTOOL if PROMTOOL.exists() else shutil.which("promtool")
            assert promtool is not None, "promtool not found (make promtool unpacks it)"
            checked = subprocess.run(
                [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr

            note = f"rank 1 on {slow_node}"
            assert note in why["straggler"]
            (row,) = [j for j in listed if j["id"] == job.id]
            assert note in row["straggler"]
            assert page["training"]["jitter"]["seconds"] > 0.1
            assert page["training"]["jitter"]["nodes"][slow_node] > 0.1
            login = ["--url", url, "--token", tokens["admin"]]
            shown = CliRunner().invoke(app, ["why", job.id, *login])
            assert shown.exit_code == 0 and note in shown.output, shown.output

            deadline = time.monotonic() + 120
            while store.get_job(None, job.id).state is not JobState.SUCCEEDED:
                record = store.get_job(None, job.id)
                waiting = (record.state, record.pending_reason, ray_load())
                assert time.monotonic() < deadline, waiting
                loop.tick()
                time.sleep(0.3)
            with server.client("admin") as client:
                after = client.get("/metrics").text
            for family in ("job_sync_jitter", "node_sync_jitter", "job_straggler_ratio"):
                assert job.id not in "".join(
                    line for line in after.splitlines() if family in line
                ), family  # the ended job's series are gone
    finally:
        for job_id in list(loop.gangs.launched):
            handle = runtime.gang(job_id)
            if handle is not None:
                handle.stop(1)
        loop.launcher.shutdown()
        store.close()


def test_a_spec_asking_fp16_compression_halves_what_each_rank_sends(
    runtime: Runtime, tmp_path: Path
) -> None:
    """The spec's ``comm:`` reaches the ranks: the step shim registers PyTorch's fp16 hook on
    the unmodified DDP script, whose 33 gradients then go out as 66 bytes a step, not 132."""
    store = Store.open(tmp_path)
    store.create_tenant(Tenant("a"), "test")
    loop = ControlLoop(store, runtime, discover, WallClock(), LoopSettings(stop_grace_s=3))
    spec = jobspec_from_mapping(
        {
            "name": "ddp-fp16",
            "entrypoint": "ddp_plain.py",
            "code": ship(runtime.state_dir, "a", JOBS),
            "workers": 2,
            "args": ["--steps", "12"],
            "resources": {"gpus": 1, "cpus": 0.1, "memory_gb": 0.1},
            "comm": {"hook": "fp16"},
        }
    )
    job, _ = store.submit_job("a", spec, "tester")
    try:
        deadline = time.monotonic() + 120
        while store.get_job(None, job.id).state is not JobState.SUCCEEDED:
            record = store.get_job(None, job.id)
            assert time.monotonic() < deadline and not record.state.terminal, record
            loop.tick()
            time.sleep(0.3)
        telemetry = runtime.telemetry(job.id)
        for rank in range(2):
            sent = [
                record.metrics["comm_bytes"]
                for record in telemetry[rank]
                if record.kind == "step" and "comm_bytes" in record.metrics
            ]
            assert len(sent) >= 10 and set(sent[1:]) == {66.0}, sent
    finally:
        loop.launcher.shutdown()
        store.close()


def run_shim(
    tmp_path: Path, script: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "job.py").write_text(script)
    telemetry = tmp_path / "rank-0.telemetry.jsonl"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AICLUSTER_TELEMETRY_FILE": str(telemetry),
        "RANK": "0",
        "AICLUSTER_NODE": "node-x",
    }
    done = subprocess.run(
        [sys.executable, "-u", str(SHIM), "job.py", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, telemetry


def test_a_job_that_reports_itself_is_not_reported_twice(tmp_path: Path) -> None:
    script = """
import torch
from aicluster import train
train.init()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 6):
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    train.report(step, loss=0.5)
train.shutdown()
"""
    done, telemetry = run_shim(tmp_path, script)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 3, 4, 5]
    assert all("comm_wait" not in r.get("metrics", {}) for r in records)


def test_a_script_without_torch_runs_as_with_python(tmp_path: Path) -> None:
    script = """
import sys
print(sys.argv, repr(__name__), "torch" in sys.modules, sys.path[0] == __import__("os").getcwd())
raise SystemExit(7)
"""
    done, telemetry = run_shim(tmp_path, script, "--flag", "x")
    assert done.returncode == 7, done.stderr
    assert done.stdout.strip() == "['job.py', '--flag', 'x'] '__main__' False True"
    assert not telemetry.exists()


def test_a_rank_forked_from_the_warm_process_is_timed_too(tmp_path: Path) -> None:
    channel, zygote = start_zygote(tmp_path, "torch")
    try:
        (tmp_path / "job.py").write_text(
            "import torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, "
            "world_size=1)\n"
            "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))\n"
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for _ in range(4):\n"
            "    model(torch.randn(8, 4)).sum().backward()\n"
            "    optimizer.step()\n"
        )
        telemetry = tmp_path / "rank-0.telemetry.jsonl"
        env = {"PATH": os.environ["PATH"], "AICLUSTER_TELEMETRY_FILE": str(telemetry)}
        out, err = tmp_path / "out.log", tmp_path / "err.log"
        child = warm.spawn_warm(channel, OWN, ["job.py"], env, str(tmp_path), out, err)
        assert child is not None
        assert child.wait() == 0, err.read_text()
        records = [json.loads(line) for line in telemetry.read_text().splitlines()]
        # The shim's "stepping" record (the first optimizer made: it will step), then a step each.
        assert [r["kind"] for r in records] == ["stepping"] + ["step"] * 4
        steps = records[1:]
        assert [r["step"] for r in steps] == [1, 2, 3, 4]
        assert all("comm_wait" in r["metrics"] for r in steps[1:])
    finally:
        zygote.kill()
        zygote.wait()
