"""The main demo: an embedded 4-node cluster, two tenants' tiny-GPT jobs, then the model served
and a new version rolled out as a canary.

Run with ``make demo``. It starts aicluster in a fresh state directory (``.demo/``), submits
``examples/jobs/tiny_gpt.yaml`` once for team-a and once for team-b (4 workers of a simulated GPU
and half a node's CPUs: each gang spans 2 nodes), and a shorter second run of team-a's model (it
queues behind the first), follows all three to SUCCEEDED and prints where they ran and how their
loss fell. Each success registers a model version (team-a's tiny-gpt gets versions 1 and 2).
Then team-a serves tiny-gpt:1 on Ray Serve, asks it for a completion, and rolls tiny-gpt:2 out in
canary steps under a steady stream of requests until it is promoted. Exits non-zero if a job
does not succeed, its loss does not fall, the rollout is not promoted, or fewer than 99% of the
requests succeed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from aicluster.cli.client import Client, resolve_target
from aicluster.cli.output import Column, fit_table, print_table

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / ".demo"
CLI = [sys.executable, "-m", "aicluster.cli.main"]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
TEAM_A = {"tenant": "team-a"}
console = Console()


def aicluster(*args: str) -> None:
    subprocess.run([*CLI, *args, "--home", str(HOME)], check=True, cwd=REPO)


def submit(spec: Path, *args: str) -> str:
    """``aicluster submit SPEC`` as a user runs it (it ships the spec's workdir); the job's id."""
    done = subprocess.run(
        [*CLI, "submit", str(spec), *args, "--home", str(HOME)],
        check=True,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    print(done.stdout, end="")
    return done.stdout.split("submitted ", 1)[1].split()[0]


class Traffic:
    """Predictions at a steady rate from a background thread, counting what succeeded."""

    def __init__(self, client: Client, rate_per_s: float = 5.0) -> None:
        self.client, self.period = client, 1.0 / rate_per_s
        self.sent = self.ok = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"prompt": "First Citizen:", "max_new_tokens": 8}
        while not self._stop.wait(self.period):
            self.sent += 1
            try:
                self.client.post("/v1/models/tiny-gpt/predict", body, params=TEAM_A)
                self.ok += 1
            except Exception:  # counted as a failure: the point is the success rate
                pass

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def serve_and_roll_out(client: Client) -> bool:
    """Serve tiny-gpt:1, ask it something, roll tiny-gpt:2 out under load; True if promoted."""
    console.rule("serving")
    aicluster("models")
    aicluster("serve", "tiny-gpt:1", "--replicas", "2", "--tenant", "team-a")
    prompt = '{"prompt": "First Citizen:", "max_new_tokens": 32}'
    aicluster("predict", "tiny-gpt", "--json", prompt, "--tenant", "team-a")
    with Traffic(client) as traffic:
        aicluster(
            "rollout", "tiny-gpt:2", "--steps", "25,50,100", "--interval", "5s",
            "--max-error-rate", "1%", "--max-p99-ms", "5000", "--tenant", "team-a", "--wait",
        )  # fmt: skip
    aicluster("deployments")
    rollout = client.get("/v1/models/tiny-gpt/rollouts", **TEAM_A)[0]  # newest first
    rate = traffic.ok / max(traffic.sent, 1)
    console.print(
        f"rollout {rollout['id']}: {rollout['state']}; {traffic.ok}/{traffic.sent} requests "
        f"({100 * rate:.1f}%) answered during it"
    )
    return rollout["state"] == "promoted" and rate >= 0.99


def follow(client: Client, job_ids: list[str], timeout_s: float = 600) -> dict[str, Any]:
    """Poll until every job ends, printing state changes and each job's latest loss."""
    seen: dict[str, tuple[str, float]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = {job_id: client.get(f"/v1/jobs/{job_id}") for job_id in job_ids}
        for job_id, job in jobs.items():
            state, last = seen.get(job_id, ("", 0.0))
            if job["state"] == state and time.monotonic() - last < 15:
                continue  # print state changes at once, progress every 15 s
            loss = latest_loss(client, job_id) if job["state"] == "RUNNING" else None
            line = job["state"] + (f", loss {loss:.3f}" if loss is not None else "")
            console.print(f"  {job['tenant']:<7} {job_id}  {line}")
            seen[job_id] = (job["state"], time.monotonic())
        if all(job["state"] in TERMINAL for job in jobs.values()):
            return jobs
        time.sleep(2)
    raise SystemExit(f"jobs did not finish within {timeout_s:.0f}s")


def rank0_steps(client: Client, job_id: str) -> list[dict[str, Any]]:
    ranks = client.get(f"/v1/jobs/{job_id}/telemetry")["ranks"]
    return [r for r in ranks.get("0", []) if r.get("kind") == "step" and "loss" in r]


def latest_loss(client: Client, job_id: str) -> float | None:
    steps = rank0_steps(client, job_id)
    return float(steps[-1]["loss"]) if steps else None


#: The summary's columns (as the CLI's: ids and states whole, the rest folds or goes first).
SUMMARY = (
    Column("job", lambda row: row[0], whole=True),
    Column("tenant", lambda row: row[1], whole=True),
    Column("state", lambda row: row[2], whole=True),
    Column("placed on", lambda row: row[3], priority=2, floor=10),
    Column("steps", lambda row: row[4], whole=True, priority=3, justify="right"),
    Column("first loss", lambda row: row[5], whole=True, priority=1, justify="right"),
    Column("final loss", lambda row: row[6], whole=True, priority=1, justify="right"),
)


def summary(client: Client, jobs: dict[str, Any], started: float) -> bool:
    ok, rows = True, []
    for job_id, job in jobs.items():
        steps = rank0_steps(client, job_id)
        first = float(steps[0]["loss"]) if steps else float("nan")
        last = float(steps[-1]["loss"]) if steps else float("nan")
        nodes = sorted({slot[0] for slot in (job["placement"] or {}).get("slots", [])})
        falling = bool(steps) and last < first
        ok = ok and job["state"] == "SUCCEEDED" and falling
        rows.append(
            (
                job_id,
                job["tenant"],
                job["state"],
                ", ".join(nodes) or "-",
                str(steps[-1]["step"]) if steps else "0",
                f"{first:.3f}",
                f"{last:.3f}",
            )
        )
    title = f"aicluster demo: finished in {time.monotonic() - started:.0f}s"
    print_table(fit_table(SUMMARY, rows, console.width, title=title), console)
    return ok


def compare_policies() -> bool:
    """The simulator on the same scheduler: the first 10,000 jobs of the Philly trace on 512
    GPUs under four policies (about 15 s; `make demo-sim` replays all 82,247)."""
    console.rule("simulator")
    out = REPO / "reports" / "demo-sim"
    command = [*CLI, "sim", "--trace", "philly", "--cluster", "examples/clusters/philly-512.yaml"]
    command += ["--compare", "fifo,sjf,tiresias,fair", "--limit", "10000", "--out", str(out)]
    # Its table fits the terminal (less important columns go); in a log file, one line a row.
    return subprocess.run(command, cwd=REPO).returncode == 0


def main() -> int:
    started = time.monotonic()
    shutil.rmtree(HOME, ignore_errors=True)
    os.environ["AICLUSTER_HOME"] = str(HOME)
    console.rule("aicluster demo")
    try:
        aicluster(
            "up", "--nodes", "4", "--gpus-per-node", "8", "--tenants", "examples/tenants.yaml"
        )
        client = Client(resolve_target(HOME))
        spec = REPO / "examples/jobs/tiny_gpt.yaml"
        job_ids = []
        for tenant in ("team-a", "team-b"):
            job_ids.append(submit(spec, "--tenant", tenant, "--idempotency-key", f"demo-{tenant}"))
        # A shorter second run of team-a's model: it queues behind the first and, registered
        # after it, becomes tiny-gpt version 2. Its spec names the same code folder.
        second = HOME / "specs" / "tiny_gpt_short.yaml"
        second.parent.mkdir(parents=True, exist_ok=True)
        text = spec.read_text().replace("workers: 4", "workers: 2").replace('"300"', '"100"')
        second.write_text(text.replace("workdir: ..", f"workdir: {REPO / 'examples'}"))
        job_ids.append(submit(second, "--idempotency-key", "demo-team-a-v2"))
        aicluster("queue")
        jobs = follow(client, job_ids, timeout_s=900)
        ok = summary(client, jobs, started)
        aicluster("status")
        ok = ok and serve_and_roll_out(client)
    finally:
        aicluster("down")
    ok = compare_policies() and ok
    console.print("[bold green]demo passed[/]" if ok else "[bold red]demo failed[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
