"""The operator and job commands of the CLI against a real server over a live control loop:
tenants, users, tokens, nodes, submit, jobs, queue, cancel, logs and status — each through its
``--url``/``--token`` options, with readable errors (no traceback) for a bad token or server."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from apiserver import serve
from liveplane import leading, open_live_plane, racks, submit, users, wait_for
from stubmodels import register_stubs
from typer.testing import CliRunner, Result

from aicluster.cli.main import app
from aicluster.control import ControlPlane
from aicluster.core import JobState, Tenant
from aicluster.store import Role

pytestmark = pytest.mark.integration

SPEC = """\
name: cli-job
tenant: a
entrypoint: train.py
workers: 2
resources: {gpus: 4}
"""

Cli = Callable[..., Result]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], ControlPlane]]:
    """A live plane's API: its URL, tokens by user, the plane."""
    plane = open_live_plane(tmp_path, [Tenant("a", quota={"H100": 16})], racks(1, 1, 2))
    tokens = users(plane.store, {"alice": ("a", Role.MEMBER)})
    with leading(plane), serve(plane) as url:
        yield url, tokens, plane
    plane.store.close()


@pytest.fixture
def cli(
    served: tuple[str, dict[str, str], ControlPlane],
) -> tuple[Cli, dict[str, str], object]:
    url, tokens, plane = served
    runner = CliRunner()  # its stdout is not a terminal: as in a pipe

    def run(
        *args: str, who: str = "admin", ok: bool = True, env: dict[str, str] | None = None
    ) -> Result:
        result = runner.invoke(app, [*args, "--url", url, "--token", tokens[who]], env=env)
        assert (result.exit_code == 0) is ok, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        return result

    return run, tokens, plane


def test_tenants_users_and_tokens(cli: tuple[Cli, dict[str, str], object]) -> None:
    run, tokens, _ = cli
    run("tenants", "set", "b", "--quota", "H100=8", "--weight", "2", "--cpus", "16")
    listed = run("tenants", "list").output
    assert re.search(r"\bb\b.*H100=8", listed), listed
    (b,) = [t for t in json.loads(run("tenants", "list", "-o", "json").output) if t["name"] == "b"]
    assert (b["cpu_quota"], b["memory_quota_gb"]) == (16.0, None)
    assert "--cpus" in run("tenants", "set", "--help").output
    created = run("users", "create", "carol", "--tenant", "b", "--role", "member").output
    carol = created.strip().splitlines()[-1]
    tokens["carol"] = carol
    assert run("jobs", who="carol").output.strip() == "no jobs"  # a's jobs are not b's
    issued = run("tokens", "create", "--description", "ci", who="alice").output.strip()
    tokens["alice-2"] = issued
    mine = run("tokens", "list", who="alice-2").output
    token_id = next(line.split()[0] for line in mine.splitlines() if "ci" in line)
    assert run("tokens", "revoke", token_id, who="alice").output.strip().endswith("revoked")
    refused = run("jobs", who="alice-2", ok=False)
    assert refused.output.startswith("error:") and "Traceback" not in refused.output


def test_submit_list_queue_cancel_logs_status(
    cli: tuple[Cli, dict[str, str], object], tmp_path: Path
) -> None:
    run, _, plane = cli
    spec = tmp_path / "project" / "job.yaml"  # submit ships the spec's folder
    spec.parent.mkdir()
    spec.write_text(SPEC)
    (spec.parent / "train.py").write_text("print('train')\n")
    submitted = run("submit", str(spec), who="alice").output
    job_id = re.search(r"submitted (\S+)", submitted).group(1)  # type: ignore[union-attr]
    store = plane.store  # type: ignore[attr-defined]
    wait_for(lambda: store.get_job(None, job_id).state is not JobState.PENDING, "admission")
    assert job_id in run("jobs", who="alice").output
    assert "queue is empty" in run("queue", who="alice").output
    assert run("cancel", job_id, who="alice").output.startswith(job_id)
    wait_for(lambda: store.get_job(None, job_id).state is JobState.CANCELLED, "cancel")
    assert run("logs", job_id, who="alice").exit_code == 0
    status = run("status").output
    assert "nodes healthy" in status and "H100" in status


def test_nodes_cordon_uncordon_drain(cli: tuple[Cli, dict[str, str], object]) -> None:
    run, _, _ = cli
    assert "node-0-0-0" in run("nodes").output
    run("nodes", "cordon", "node-0-0-0", "--reason", "bad DIMM")
    assert "bad DIMM" in run("nodes").output
    run("nodes", "uncordon", "node-0-0-0")
    run("nodes", "drain", "node-0-0-1")
    assert "drain" in run("nodes").output.lower()
    denied = run("nodes", "cordon", "node-0-0-0", who="alice", ok=False)  # members may not
    assert denied.output.startswith("error:")


# -- at 80 columns and in pipes (-o table|wide|json|yaml) -------------------------------------

STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "RUNNING", "PENDING")
LONG_REASON = (
    "exit code 1: RuntimeError: CUDA error: an illegal memory access was encountered; "
    "compile with TORCH_USE_CUDA_DSA to enable device-side assertions"
)


def _jobs_in_every_state(plane: ControlPlane) -> dict[str, str]:
    """A job per state (long names, a long exit message, a long pending reason): id by state."""
    store = plane.store
    ids = {
        "SUCCEEDED": submit(store, "a", "tokenizer-sweep", 1, 4),
        "FAILED": submit(store, "a", "eval-held-out-set", 1, 4),
        "CANCELLED": submit(store, "a", "c", 1, 4),
        "RUNNING": submit(store, "a", "llama-finetune", 1, 4),
        "PENDING": submit(store, "a", "needs-32-gpus", 4, 8),
    }
    placed = [ids[state] for state in ("SUCCEEDED", "FAILED", "CANCELLED", "RUNNING")]
    wait_for(
        lambda: all(store.get_job(None, i).state is JobState.STARTING for i in placed), "placing"
    )
    for state in ("SUCCEEDED", "FAILED", "RUNNING"):
        store.transition(ids[state], JobState.RUNNING, "test", expected_from=JobState.STARTING)
    store.transition(ids["SUCCEEDED"], JobState.SUCCEEDED, "test", exit_code=0)
    store.transition(ids["FAILED"], JobState.FAILED, "test", exit_code=1, reason=LONG_REASON)
    store.transition(ids["CANCELLED"], JobState.CANCELLED, "test", reason="cancelled by a test")
    pending = ids["PENDING"]
    wait_for(lambda: store.get_job(None, pending).pending_reason, "a pending reason")
    return ids


def _rows(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def test_listings_at_80_columns_cut_no_id_or_state(
    cli: tuple[Cli, dict[str, str], object],
) -> None:
    run, _, plane = cli
    ids = _jobs_in_every_state(plane)  # type: ignore[arg-type]
    narrow = {"COLUMNS": "80"}
    for args in (("jobs",), ("queue",), ("nodes",), ("tenants", "list"), ("tokens", "list"),
                 ("status",), ("models",), ("deployments",)):  # fmt: skip
        text = run(*args, env=narrow).output
        assert all(len(row) <= 80 for row in _rows(text)), (args, text)
        assert "…" not in text and "..." not in text, (args, text)
    listed = _rows(run("jobs", env=narrow).output)
    for state, job_id in ids.items():  # the id and its whole state on one line
        assert any(job_id in row and f" {state}" in row for row in listed), (state, listed)
    assert "reason / exit" in listed[0]  # it folds at 80 columns rather than go
    folded = " ".join(" ".join(listed).split())
    assert "enable device-side assertions" in folded and "illegal memory access" in folded
    queued = _rows(run("queue", env=narrow).output)
    assert any(ids["PENDING"] in row for row in queued), queued
    for tight in ("40", "20"):  # narrower than the ids and states: wider lines, nothing cut
        rows = _rows(run("jobs", env={"COLUMNS": tight}).output)
        for state, job_id in ids.items():
            assert any(job_id in row and f" {state}" in row for row in rows), (tight, rows)
    wide = _rows(run("jobs", "-o", "wide", env=narrow).output)
    assert "restarts" in wide[0] and all(any(i in row for row in wide) for i in ids.values())
    assert all(row.count(" ") for row in wide)


def test_listings_in_a_pipe_are_a_row_a_line_and_parse_as_json_and_yaml(
    cli: tuple[Cli, dict[str, str], object], tmp_path: Path
) -> None:
    run, _, plane = cli
    ids = _jobs_in_every_state(plane)  # type: ignore[arg-type]
    store = plane.store  # type: ignore[attr-defined]
    register_stubs(store, "a", "a-model-with-a-rather-long-name", tmp_path, 1)
    store.put_deployment(
        "a", "a-model-with-a-rather-long-name", {"replicas": 1}, {1: 100.0}, "alice"
    )
    rows = _rows(run("jobs").output)  # CliRunner's stdout is a pipe; no COLUMNS: unbounded
    assert len(rows) == 1 + len(ids)
    for state, job_id in ids.items():
        assert any(job_id in row and f" {state}" in row for row in rows), rows
    assert any(LONG_REASON in row for row in rows), rows
    endpoint = "/v1/models/a-model-with-a-rather-long-name/predict?tenant=a"
    assert endpoint in run("deployments").output
    narrow = _rows(run("deployments", env={"COLUMNS": "80"}).output)
    assert any(re.match(r"a-model-with-a-rather-long-name +a +v1 100%", row) for row in narrow)
    assert all(len(row) <= 80 for row in narrow) and "…" not in " ".join(narrow)
    assert endpoint in run("deployments", "-o", "wide", env={"COLUMNS": "80"}).output

    for fmt, parse in (("json", json.loads), ("yaml", yaml.safe_load)):
        page = parse(run("jobs", "-o", fmt, env={"COLUMNS": "80"}).output)
        assert {job["id"]: job["state"] for job in page["jobs"]} == {i: s for s, i in ids.items()}
        failed = next(job for job in page["jobs"] if job["id"] == ids["FAILED"])
        assert failed["exit_message"] == LONG_REASON  # whole, on any terminal
        assert [e["job_id"] for e in parse(run("queue", "-o", fmt).output)] == [ids["PENDING"]]
        assert parse(run("why", ids["PENDING"], "-o", fmt).output)["state"] == "PENDING"
        assert {n["name"] for n in parse(run("nodes", "-o", fmt).output)} == {
            "node-0-0-0",
            "node-0-0-1",
        }
        assert [t["name"] for t in parse(run("tenants", "list", "-o", fmt).output)] == ["a"]
        assert parse(run("tokens", "list", "-o", fmt).output)
        status = parse(run("status", "-o", fmt).output)
        assert status["cluster"]["nodes"] == 2 and "leader" in status["health"]
        models = parse(run("models", "-o", fmt).output)
        assert [m["name"] for m in models] == ["a-model-with-a-rather-long-name"]
        versions = parse(run("model", "show", "a-model-with-a-rather-long-name", "-o", fmt).output)
        assert [v["version"] for v in versions] == [1]
        (deployment,) = parse(run("deployments", "-o", fmt).output)
        assert deployment["endpoint"].endswith(endpoint)
        rollout = ["rollout", "a-model-with-a-rather-long-name", "--status", "-o", fmt]
        assert parse(run(*rollout).output) is None  # none yet


def _real(argv: list[str], terminal: bool) -> str:
    """The CLI as a person runs it: stdout a real pipe, or an 80×24 terminal (no COLUMNS)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    command = [sys.executable, "-m", "aicluster.cli.main", *argv]
    if not terminal:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env |= {"TERM": "xterm-256color"}
    process = subprocess.Popen(command, stdin=child, stdout=child, stderr=child, env=env)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert process.wait(timeout=60) == 0, b"".join(chunks)
    ansi = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
    return ansi.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def test_an_80_column_terminal_and_a_real_pipe(
    cli: tuple[Cli, dict[str, str], object], served: tuple[str, dict[str, str], ControlPlane]
) -> None:
    url, tokens, plane = served
    ids = _jobs_in_every_state(plane)
    argv = ["jobs", "--url", url, "--token", tokens["admin"]]
    shown = _rows(_real(argv, terminal=True))
    assert all(len(row) <= 80 for row in shown), shown
    piped = _rows(_real(argv, terminal=False))
    assert len(piped) == 1 + len(ids)
    for rows in (shown, piped):
        for state, job_id in ids.items():
            assert any(job_id in row and f" {state}" in row for row in rows), rows
    assert "…" not in " ".join(shown + piped)
    page = json.loads(_real([*argv, "-o", "json"], terminal=True))  # no markup in a terminal
    assert {job["id"] for job in page["jobs"]} == set(ids.values())


def test_the_simulator_table_fits_80_columns(tmp_path: Path) -> None:
    args = [
        "sim",
        "--trace",
        "philly",
        "--cluster",
        str(ROOT / "examples/clusters/philly-512.yaml"),
    ]
    args += ["--compare", "fifo,sjf,tiresias,fair", "--limit", "200", "--no-report"]
    args += ["--out", str(tmp_path)]
    runner = CliRunner()
    narrow = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    rows = _rows(narrow.output)
    assert all(len(row) <= 80 for row in rows) and "…" not in narrow.output, narrow.output
    for policy in ("fifo", "sjf", "tiresias", "fair"):
        assert any(row.split()[0] == policy for row in rows), rows
    wide = runner.invoke(app, [*args, "-o", "wide"], env={"COLUMNS": "80"})
    assert "p50 h" in wide.output and "failures" in wide.output, wide.output
    document = json.loads(runner.invoke(app, [*args, "-o", "json"], env={"COLUMNS": "80"}).stdout)
    assert [run["policy"] for run in document["runs"]] == ["fifo", "sjf", "tiresias", "fair"]
    again = yaml.safe_load(runner.invoke(app, [*args, "-o", "yaml"]).stdout)
    assert [run["policy"] for run in again["runs"]] == ["fifo", "sjf", "tiresias", "fair"]


def test_help_at_80_columns_reads_naturally() -> None:
    shown = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "80"}).output
    assert "--auth / --no-auth" in shown and "--no-no-auth" not in shown, shown
    assert "--insecure-no-sandbox" in shown and "--no-insecure" not in shown
    assert "--max-code-bytes-per-tenant" in shown and "…" not in shown  # no option name cut
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    jobs = CliRunner().invoke(app, ["jobs", "--help"], env={"COLUMNS": "80"}).output
    assert "-o, --output <table|wide|json|yaml>" in jobs, jobs
