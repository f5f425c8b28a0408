"""Job submissions through the real HTTP API: sustained rate and latency with N concurrent clients.

The server is the aicluster API (uvicorn, a real store, no control loop) in a subprocess, so it
has an interpreter of its own; clients are threads in this process, each with its own keep-alive
connection (``httpx.Client``), each submitting a JSON job spec as soon as the previous one is
acknowledged (201: stored and committed). Prints a table; asserts nothing.

    .venv/bin/python bench/api_submit.py                           # SQLite in a temporary dir
    .venv/bin/python bench/api_submit.py --db postgresql://postgres@127.0.0.1:5432/postgres
    .venv/bin/python bench/api_submit.py --clients 1 16 64 --seconds 10 --keyed

``--db`` names a PostgreSQL server (any database on it): a scratch database is created there and
dropped at the end. ``whoami`` rows measure the same clients on an authenticated GET, the
HTTP + authentication floor under each submission. ``srv cpu`` and ``cli cpu`` are CPU
milliseconds per successful request spent by the server (its processes) and by the clients:
unlike rates, they hardly move when other work shares the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

SPEC = {
    "name": "bench",
    "tenant": "bench",
    # A module: the server takes an entrypoint only with shipped code (and none runs here).
    "module": "tiny_gpt",
    "args": ["--steps", "200"],
    "workers": 4,
    "resources": {"gpus": 1},
    "env": {"A": "1"},
}


# -- the server (a subprocess) ---------------------------------------------------------------


def app_factory():  # type: ignore[no-untyped-def]
    """The API over the store at ``$AICLUSTER_BENCH_STORE`` (uvicorn imports this by name, so
    ``--workers`` > 1 works)."""
    from aicluster.api import ServerSettings, create_app
    from aicluster.control import ControlPlane
    from aicluster.store import Store
    from aicluster.store.base import WallClock

    location = os.environ["AICLUSTER_BENCH_STORE"]
    store = Store.open(location)
    state_dir = Path(location) if "://" not in location else Path(tempfile.gettempdir())
    settings = ServerSettings(
        state_dir=state_dir,
        db_url=location if "://" in location else None,
        # throughput is measured here, not the limits that keep one token or tenant from
        # flooding the queue (they would stop the run at a few thousand submissions)
        max_pending_per_tenant=0,
        submit_rate_per_token="",
        submit_rate_per_tenant="",
    )
    return create_app(ControlPlane(settings=settings, store=store, clock=WallClock()))


def serve(location: str, port: int, workers: int) -> None:
    import uvicorn

    os.environ["AICLUSTER_BENCH_STORE"] = location
    uvicorn.run(
        "api_submit:app_factory",
        factory=True,
        app_dir=str(Path(__file__).parent),
        host="127.0.0.1",
        port=port,
        workers=workers,
        log_level="warning",
        access_log=False,
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (uvicorn workers), from /proc."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, ... utime is field 14 and stime 15 of the whole line.
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


@contextlib.contextmanager
def server_process(location: str, workers: int) -> Iterator[tuple[str, int]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    command = [sys.executable, __file__, "--serve", location, "--port", str(port)]
    process = subprocess.Popen([*command, "--workers", str(workers)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("the API server did not start")
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- the store ---------------------------------------------------------------------------------


@contextlib.contextmanager
def store_location(db: str | None) -> Iterator[str]:
    """A SQLite state directory, or a scratch PostgreSQL database created and dropped here."""
    if db is None:
        with tempfile.TemporaryDirectory() as scratch:
            yield scratch
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    server = make_url(db).set(drivername="postgresql+psycopg")
    name = f"aicluster_bench_{os.getpid()}_{secrets.token_hex(3)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def seed(location: str) -> tuple[str, str]:
    """Tenant ``bench`` and a member of it; returns (the member's token, the store's dialect)."""
    from aicluster.core import Tenant
    from aicluster.store import Role, Store

    with Store.open(location) as store:
        store.put_tenant(Tenant("bench", quota={"H100": 1_000_000}), "bench")
        store.create_user("bench", "bench")
        store.grant_role("bench", "bench", Role.MEMBER, "bench")
        return store.create_token("bench", "bench").token, store.dialect


# -- the clients -------------------------------------------------------------------------------


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    errors: Counter[int] = field(default_factory=Counter)
    elapsed: float = 0.0
    server_cpu: float = 0.0  # seconds over the measured window
    client_cpu: float = 0.0


def drive(
    url: str, server_pid: int, token: str, clients: int, seconds: float, what: str, keyed: bool
) -> Result:
    """``clients`` threads, each with its own keep-alive ``httpx.Client``, for ``seconds`` after
    a 1 s warm-up. (Measured here: a thread per client costs about half the client CPU per
    request of asyncio tasks sharing one ``httpx.AsyncClient``.)"""
    result = Result()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    prefix = secrets.token_hex(4)
    lock = threading.Lock()
    started = time.perf_counter()
    measure_from, stop_at = started + 1.0, started + 1.0 + seconds

    def client(index: int) -> None:
        latencies, errors, sent = [], Counter[int](), 0
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            while (now := time.perf_counter()) < stop_at:
                if what == "whoami":
                    response = http.get("/v1/whoami")
                    ok = response.status_code == 200
                else:
                    key = {"Idempotency-Key": f"{prefix}-{index}-{sent}"} if keyed else None
                    response = http.post("/v1/jobs", json=SPEC, headers=key)
                    ok = response.status_code == 201
                sent += 1
                if now < measure_from:
                    continue
                if ok:
                    latencies.append(time.perf_counter() - now)
                else:
                    errors[response.status_code] += 1
        with lock:
            result.latencies.extend(latencies)
            result.errors.update(errors)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, measure_from - time.perf_counter()))
    server, own = cpu_seconds(server_pid), time.process_time()
    time.sleep(max(0.0, stop_at - time.perf_counter()))
    result.server_cpu = cpu_seconds(server_pid) - server
    result.client_cpu = time.process_time() - own
    for thread in threads:
        thread.join()
    result.elapsed = time.perf_counter() - measure_from
    return result


def row(dialect: str, what: str, clients: int, result: Result) -> str:
    lat = sorted(result.latencies)
    if not lat:
        return f"{dialect:10} {what:7} {clients:7d}  no successful requests; errors {result.errors}"
    p50 = statistics.median(lat) * 1000
    p99 = lat[max(0, int(len(lat) * 0.99) - 1)] * 1000
    errors = sum(result.errors.values())
    server_ms, client_ms = (cpu / len(lat) * 1000 for cpu in (result.server_cpu, result.client_cpu))
    return (
        f"{dialect:10} {what:7} {clients:7d} {len(lat):8d} {len(lat) / result.elapsed:8.0f}/s "
        f"{p50:8.1f} {p99:8.1f} {lat[-1] * 1000:8.1f} {errors:7d} {server_ms:8.2f} {client_ms:8.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="a PostgreSQL server URL (default: SQLite in a temp dir)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured per row")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--keyed", action="store_true", help="send an Idempotency-Key each")
    parser.add_argument("--no-whoami", action="store_true", help="skip the whoami rows")
    parser.add_argument("--serve", metavar="STORE", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.workers)
        return
    with store_location(args.db) as location:
        token, dialect = seed(location)
        with server_process(location, args.workers) as (url, pid):
            print(f"uvicorn workers={args.workers} keyed={args.keyed} load={os.getloadavg()}")
            print(
                f"{'store':10} {'request':7} {'clients':>7} {'ok':>8} {'rate':>10} "
                f"{'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'errors':>7} "
                f"{'srv cpu':>8} {'cli cpu':>8}"
            )
            kinds = ["submit"] if args.no_whoami else ["whoami", "submit"]
            for clients in args.clients:
                for what in kinds:
                    result = drive(url, pid, token, clients, args.seconds, what, args.keyed)
                    print(row(dialect, what, clients, result), flush=True)
            print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
