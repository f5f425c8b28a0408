"""``aicluster sim`` end to end: a replay writes JSON, CSV, PNG and HTML; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from aicluster.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_compare_policies_on_the_first_philly_jobs(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = runner.invoke(
        app,
        [
            "sim",
            "--trace",
            "philly",
            "--cluster",
            str(ROOT / "examples/clusters/philly-512.yaml"),
            "--compare",
            "fifo,tiresias",
            "--limit",
            "300",
            "--out",
            str(out),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "philly-512" in result.output and "tiresias" in result.output
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert [run["policy"] for run in runs] == ["fifo", "tiresias"]
    assert all(run["completed"] == 300 for run in runs)
    assert (out / "summary.csv").read_text().count("\n") == 3
    assert len((out / "jobs-fifo.csv").read_text().splitlines()) == 301
    for name in ("timeline.png", "jct_cdf.png", "tenant_share.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "tiresias" in page


def test_a_synthetic_trace_on_a_generated_cluster(tmp_path: Path) -> None:
    args = ["sim", "--trace", "synthetic", "--nodes", "8", "--days", "1", "--policy", "fair"]
    result = runner.invoke(app, [*args, "--no-report", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert run["gpus"] == 64 and run["jobs"] > 0


def test_a_bad_trace_row_names_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("submit_time,duration,num_gpus\n0,60,1\n5,abc,1\n")
    result = runner.invoke(app, ["sim", "--trace", str(trace), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{trace}:3: duration must be a positive number, got 'abc'" in result.output
    assert "Traceback" not in result.output


def test_a_bad_cluster_file_and_a_bad_policy_exit_2(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: x\nlayout:\n  nodes_per_rack: 2\n  gpus: eight\n")
    result = runner.invoke(app, ["sim", "--cluster", str(cluster), "--limit", "5"])
    assert result.exit_code == 2
    assert f"{cluster}:4: gpus must be an integer, got 'eight'" in result.output
    result = runner.invoke(app, ["sim", "--compare", "fifo,lottery", "--limit", "5"])
    assert result.exit_code == 2 and "unknown policy lottery" in result.output


def test_the_placement_strategy_and_the_communication_model_from_the_command_line(
    tmp_path: Path,
) -> None:
    """Random placement with the communication model on: the first Philly jobs complete; an
    unknown strategy exits 2 naming the choices."""
    args = ["sim", "--cluster", str(ROOT / "examples/clusters/philly-512.yaml"), "--limit", "300"]
    config = ["--config", str(ROOT / "examples/config/communication.yaml")]
    result = runner.invoke(
        app, [*args, *config, "--placement", "random", "--no-report", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert run["completed"] == 300
    result = runner.invoke(app, [*args, "--placement", "spread", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown placement 'spread'" in result.output
