"""A hostile tenant's job: does its work, then tries to reach what it must not.

    python probe.py --targets FILE_OF_JSON

Prints ``RESULT <n>`` from its own module, writes ``result.txt`` to its run directory, then one
line ``PROBES {json}``: for each attempt, ``"denied: <why>"`` or ``"ALLOWED: <what>"``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import helper_mod  # the job's own module, from the shipped tree


def attempt(action: Any) -> str:
    try:
        result = action()
    except Exception as error:
        return f"denied: {type(error).__name__}: {error}"[:200]
    return f"ALLOWED: {result!r}"[:200]


def write(path: str) -> str:
    with open(path, "w") as handle:
        handle.write("written by a hostile job\n")
    return path


# A driver that may reach Ray connects within seconds; one refused keeps retrying (the GCS for
# minutes, the Ray client for 30 s), so each attempt is given 30 s, and the three run at once.
CONNECT_S = 30


def ray_connect(address: str) -> str:
    code = (
        "import ray, sys\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "print('CONNECTED', ray.cluster_resources())\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=CONNECT_S
        )
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"no connection within {CONNECT_S} s") from None
    if "CONNECTED" in done.stdout:
        return done.stdout.strip()[-150:]
    raise ConnectionError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")


#: Files of the launcher's working directory (a checkout of aicluster) a job must not see.
LAUNCHER = ("README.md", "pyproject.toml", "Makefile")


def _listing(folder: str) -> list[str]:
    """What the job finds in ``folder`` (empty when it cannot list it)."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _listening_ports() -> set[int]:
    """The TCP ports listening in this network namespace (the node's, for now)."""
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in rows.read().splitlines()[1:]:
                fields = row.split()
                if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _open_metrics(job_id: str) -> dict[int, bool]:
    """The ports whose ``GET /metrics`` answers without a token, each with whether it names
    ``job_id`` (Ray's metrics export did: its actor names carry every tenant's job ids)."""

    def answer(port: int) -> bool | None:
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=0.5) as answer:
                return job_id in answer.read(8 << 20).decode(errors="replace")
        except Exception:
            return None

    ports = sorted(_listening_ports())
    with ThreadPoolExecutor(16) as pool:
        found = zip(ports, pool.map(answer, ports), strict=True)
        return {port: named for port, named in found if named is not None}


def main() -> None:
    targets = json.loads(Path(sys.argv[sys.argv.index("--targets") + 1]).read_text())
    run_dir = Path(os.environ["AICLUSTER_RUN_DIR"])
    helper_mod.start_heartbeat()
    print(f"RESULT {helper_mod.answer()}", flush=True)
    (run_dir / "result.txt").write_text(f"{helper_mod.answer()}\n")
    probes: dict[str, str] = {
        "uid": str(os.getuid()),
        "read admin token": attempt(lambda: Path(targets["admin_token"]).read_text()),
        "read ray token": attempt(lambda: Path(targets["ray_token"]).read_text()),
        "open database": attempt(
            lambda: (
                sqlite3.connect(f"file:{targets['database']}?mode=ro", uri=True)
                .execute("select count(*) from jobs")
                .fetchall()
            )
        ),
        "list state dir": attempt(lambda: os.listdir(targets["state_dir"])),
        "list other tenant's data": attempt(lambda: os.listdir(targets["other_data"])),
        "read other tenant's file": attempt(lambda: Path(targets["other_file"]).read_text()),
        "read other tenant's log": attempt(lambda: Path(targets["other_log"]).read_text()),
        "list Ray's session": attempt(lambda: os.listdir("/tmp/ray")),
        "read launcher's files": attempt(
            lambda: [Path(targets["launcher_dir"], name).read_text()[:20] for name in LAUNCHER]
        ),
        "list launcher's directory": json.dumps(_listing(targets["launcher_dir"])),
    }
    ray_addresses = {
        "ray.init auto": "auto",
        "ray.init gcs": targets["gcs_address"],
        "ray client": targets["ray_client"],
    }
    with ThreadPoolExecutor(len(ray_addresses)) as pool:
        tries = {
            name: pool.submit(attempt, lambda address=address: ray_connect(address))
            for name, address in ray_addresses.items()
        }
    probes.update((name, found.result()) for name, found in tries.items())
    for pid in targets["other_pids"]:
        probes[f"see pid {pid}"] = attempt(lambda pid=pid: Path(f"/proc/{pid}/cmdline").read_text())
        probes[f"signal pid {pid}"] = attempt(lambda pid=pid: os.kill(pid, signal.SIGTERM))
    visible = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    probes["processes seen"] = json.dumps(visible)
    probes["metrics without a token"] = json.dumps(_open_metrics(targets["other_job"]))
    print("probed Ray", flush=True)
    for path in targets["forbidden_writes"]:
        probes[f"write {path}"] = attempt(lambda path=path: write(path))
    for path in (os.path.join(os.getcwd(), "scratch.txt"), str(run_dir / "w.txt"), "/tmp/w.txt"):
        probes[f"allowed write {path}"] = attempt(lambda path=path: write(path))
    probes["environment"] = json.dumps(dict(os.environ))
    probes["files shipped"] = json.dumps(sorted(os.listdir(".")))
    print("PROBES " + json.dumps(probes), flush=True)


if __name__ == "__main__":
    main()
