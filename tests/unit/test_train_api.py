"""The in-job train API: telemetry format, backend choice, a world of one, and its imports."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from aicluster.train import StepRecord, TelemetryWriter, choose_backend, read_records


def test_writer_and_reader_agree_and_resume_from_an_offset(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.telemetry.jsonl"
    writer = TelemetryWriter(path, rank=0, node="node-1", attempt=2)
    writer.write("start")
    step = writer.write("step", step=1, loss=2.5, samples=32, metrics={"lr": 0.1})
    assert step.step_time is not None and step.throughput == 32 / step.step_time
    records, offset = read_records(path)
    assert [r.kind for r in records] == ["start", "step"]
    assert records[1] == step and records[1].node == "node-1"
    with open(path, "a") as handle:
        handle.write('{"kind": "step", "rank": 0, "ti')  # a line still being written
    more, offset2 = read_records(path, offset)
    assert more == [] and offset2 == offset
    with open(path, "a") as handle:
        handle.write('me": 1.0}\nnot json\n')
    more, _ = read_records(path, offset)
    assert more == [StepRecord(kind="step", rank=0, time=1.0)]
    assert read_records(tmp_path / "missing.jsonl") == ([], 0)
    writer.close()


def test_backend_is_nccl_only_for_real_gpus() -> None:
    assert choose_backend(cuda_available=True, gpus=1) == "nccl"
    assert choose_backend(cuda_available=False, gpus=8) == "gloo"
    assert choose_backend(cuda_available=True, gpus=0) == "gloo"
    assert choose_backend(cuda_available=True, gpus=1, override="gloo") == "gloo"


def test_train_imports_neither_ray_nor_the_control_plane() -> None:
    code = (
        "import sys, aicluster.train; "
        "bad = [m for m in sys.modules if m == 'ray' or m.startswith(('aicluster.runtime', "
        "'aicluster.control', 'aicluster.api', 'aicluster.store'))]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_script_alone_is_a_world_of_one_and_reports_telemetry(tmp_path: Path) -> None:
    telemetry = tmp_path / "t.jsonl"
    code = (
        "import aicluster.train as t; c = t.init(); assert (c.rank, c.world_size) == (0, 1); "
        "t.report(1, loss=0.5, samples=4); t.barrier(); t.shutdown()"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")},
        "AICLUSTER_TELEMETRY_FILE": str(telemetry),
    }
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    kinds = [json.loads(line)["kind"] for line in telemetry.read_text().splitlines()]
    assert kinds == ["start", "step", "end"]


def test_a_checkpoint_record_does_not_split_a_steps_time(tmp_path: Path) -> None:
    writer = TelemetryWriter(tmp_path / "t.jsonl", rank=0, node=None, attempt=None)
    writer.write("start")
    time.sleep(0.05)
    writer.write("checkpoint", step=1, metrics={"seconds": 0.01})
    step = writer.write("step", step=2)
    assert step.step_time is not None and step.step_time >= 0.05
    writer.close()
    kinds = [r.kind for r in read_records(tmp_path / "t.jsonl")[0]]
    assert kinds == ["start", "checkpoint", "step"]
