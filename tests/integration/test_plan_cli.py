"""``aicluster plan`` end to end on a Philly window: the answer N is checked by replays of
its own (``aicluster sim`` on the cluster files it wrote) at N, which meets the SLO, and at
N - 1, which misses it; bad input is a readable error."""

from __future__ import annotations

import csv
import functools
import json
from pathlib import Path

from typer.testing import CliRunner

from aicluster.cli.main import app
from aicluster.core import parse_cluster
from aicluster.sim import TraceJob, load_philly

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = str(ROOT / "examples/clusters/philly-512.yaml")
runner = CliRunner()


@functools.cache
def _philly() -> list[TraceJob]:
    return load_philly()  # (read once for the module's tests)


def _window(path: Path, first: int = 10_000, count: int = 300) -> Path:
    """Philly jobs ``first`` to ``first + count`` as a generic CSV, times from the window's start
    (a busy 40 minutes: 300 jobs, up to 8 GPUs each)."""
    jobs = _philly()[first : first + count]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "submit_time", "duration", "num_gpus", "tenant"])
        for job in jobs:
            start = job.submit_time - jobs[0].submit_time
            writer.writerow([job.id, start, job.duration, job.num_gpus, job.tenant])
    return path


def _p95_wait(trace: Path, cluster: Path, out: Path) -> float:
    args = ["sim", "--trace", str(trace), "--cluster", str(cluster), "--no-report"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return float(json.loads((out / "summary.json").read_text())["runs"][0]["queue_delay_p95"])


def test_the_answer_meets_the_slo_and_one_node_fewer_misses(tmp_path: Path) -> None:
    trace, out = _window(tmp_path / "window.csv"), tmp_path / "plan"
    args = ["plan", "--trace", str(trace), "--cluster-template", TEMPLATE]
    args += ["--slo", "p95_wait<=1h", "--vary", "nodes=4..64", "--workers", "2"]
    result = runner.invoke(app, [*args, "--out", str(out)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    answer = json.loads((out / "plan.json").read_text())["answers"][0]
    nodes = answer["nodes"]
    assert f"smallest: {nodes} nodes ({nodes * 8} GPUs)" in result.output
    assert answer["below"] == nodes - 1 and answer["gpus"] == nodes * 8
    tried = (out / "plan.csv").read_text().splitlines()[1:]
    assert len(tried) < 12  # searched, not swept over 61 sizes
    at_n = _p95_wait(trace, out / f"clusters/nodes-{nodes}.yaml", tmp_path / "n")
    below = _p95_wait(trace, out / f"clusters/nodes-{nodes - 1}.yaml", tmp_path / "below")
    assert at_n <= 3600 < below
    assert (out / "plan.svg").read_text().startswith("<svg")


def test_bad_input_is_a_readable_error(tmp_path: Path) -> None:
    trace = _window(tmp_path / "window.csv", count=5)
    base = ["plan", "--trace", str(trace), "--cluster-template", TEMPLATE, "--out", str(tmp_path)]
    cases = [
        (["--slo", "p95_latency<=1h", "--vary", "nodes=1..4"], "unknown metric 'p95_latency'"),
        (["--slo", "p95_wait~1h", "--vary", "nodes=1..4"], "expected METRIC OP BOUND"),
        (["--slo", "p95_wait<=1h", "--vary", "nodes=4..1"], "1 <= LOW <= HIGH"),
        (["--slo", "p95_wait<=1h", "--vary", "gpus=8"], "unknown dimension 'gpus'"),
        (
            ["--slo", "p95_wait<=1h", "--vary", "nodes=1..2", "--policy", "lottery"],
            "unknown policy",
        ),
    ]
    for extra, says in cases:
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code == 2, result.output
        assert says in result.output and "Traceback" not in result.output
    missing = ["--cluster-template", str(tmp_path / "none.yaml")]
    result = runner.invoke(app, [*base, "--slo", "p95_wait<=1h", "--vary", "nodes=1..2", *missing])
    assert result.exit_code == 2 and "cannot read the cluster file" in result.output


def test_gpu_types_and_racks_are_variants_each_with_its_answer(tmp_path: Path) -> None:
    trace, out = _window(tmp_path / "window.csv", count=120), tmp_path / "plan"
    args = ["plan", "--trace", str(trace), "--cluster-template", TEMPLATE, "--out", str(out)]
    args += ["--slo", "p95_wait<=1h", "--slo", "utilization>=1%", "--workers", "1"]
    args += ["--vary", "nodes=2..24:2", "--vary", "gpu_type=V100,H100", "--vary", "racks=1,3"]
    result = runner.invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    answers = json.loads((out / "plan.json").read_text())["answers"]
    assert [(a["gpu_type"], a["racks"]) for a in answers] == [
        ("V100", 1),
        ("V100", 3),
        ("H100", 1),
        ("H100", 3),
    ]
    for answer in answers:
        assert answer["line"] in result.output and answer["nodes"] is not None
        assert f"[gpu_type={answer['gpu_type']}, racks={answer['racks']}]" in answer["line"]
    grown = (out / f"clusters/nodes-{answers[3]['nodes']}-H100-3.yaml").read_text()
    cluster = parse_cluster(grown)
    assert {node.gpu_type for node in cluster.nodes} == {"H100"} and len(cluster.racks()) == 3
