"""What aicluster's serving gateway adds over a bare Ray Serve deployment of the same model.

One embedded Ray cluster; the same small torch model artifact (the MLP of the serving tests) is
served twice, with the same replica options (``aicluster.serve.replica.ModelReplica``):

* **bare**: a Serve application with an HTTP route, reached through Serve's own HTTP proxy;
* **sandboxed**: the same, its model's code in a tenant's sandbox behind a local socket
  (``aicluster.serve.sandboxed``; root and bubblewrap needed, else left out): what the sandbox
  adds;
* **aicluster**: a control-plane server process (``python -m aicluster.server``) whose
  gateway authenticates the bearer token, picks the version by traffic weight and calls the
  version's Serve application through a handle (``POST /v1/models/NAME/predict``); its
  replicas sandbox the model as ``aicluster up`` does where this machine can.

The same client measures both in the same run, alternating rounds: ``--concurrency`` threads,
each with its own keep-alive ``httpx.Client``, sending the next request when the previous one is
answered, for ``--seconds`` per round. Prints p50/p99 latency and throughput per target, the
added p50 and the throughput ratio, and the load average. Asserts nothing.

    .venv/bin/python bench/serve_overhead.py --concurrency 1 4 --seconds 10 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Ray reads it at import: the embedded cluster binds 127.0.0.1.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))  # the serving tests' model artifact

from serving import build_mlp, mlp_inputs  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Round:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0


def measure(url: str, headers: dict[str, str], concurrency: int, seconds: float) -> Round:
    """Closed loop: each thread sends its next request as soon as one is answered."""
    result = Round()
    lock = threading.Lock()
    body = httpx.Request("POST", url, json=mlp_inputs()).content
    headers = {**headers, "Content-Type": "application/json"}
    deadline = time.monotonic() + seconds

    def client() -> None:
        mine: list[float] = []
        errors = 0
        with httpx.Client(headers=headers, timeout=30) as http:
            http.post(url, content=body)  # connect and warm up outside the measurement
            while time.monotonic() < deadline:
                started = time.perf_counter()
                response = http.post(url, content=body)
                if response.status_code == 200:
                    mine.append(time.perf_counter() - started)
                else:
                    errors += 1
        with lock:
            result.latencies.extend(mine)
            result.errors += errors

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.seconds = time.monotonic() - started
    return result


# -- the two targets --------------------------------------------------------------------------


def bare_app(
    artifact: str, replicas: int, sandbox: dict[str, Any] | None = None, name: str = "Bare"
) -> Any:
    """A plain Serve deployment of the same replica class with an HTTP route of its own."""
    from ray import serve
    from starlette.requests import Request

    from aicluster.serve.replica import ModelReplica, deployment_options

    class Bare(ModelReplica):
        async def __call__(self, request: Request) -> dict[str, Any]:
            return self.predict(await request.json())

    options = deployment_options({"replicas": replicas})
    options["name"] = name
    return serve.deployment(Bare).options(**options).bind(artifact, sandbox)


@contextlib.contextmanager
def aicluster_server(state: Path, address: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    log = open(state / "server.log", "ab")  # noqa: SIM115 - closed below
    command = [sys.executable, "-m", "aicluster.server", "--state-dir", str(state)]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--ray-address", address],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if condition():
                return
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def setup_aicluster(state: Path, url: str, artifact: Path, replicas: int) -> dict[str, str]:
    from aicluster.core import Tenant
    from aicluster.store import Store

    wait(lambda: httpx.get(f"{url}/healthz").json()["leader"], 120, "the server to lead")
    token = (state / "admin.token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    with Store.open(state) as store:
        store.create_tenant(Tenant("bench", {}, {}, 1.0), "bench")
        store.register_model_version(
            "bench",
            "mlp",
            source_dir=artifact,
            job_id=None,
            spec_hash=None,
            code_version="bench",
            dataset_hash=None,
            metrics={},
            registered_by="bench",
        )
    body = {"model": "mlp", "version": 1, "tenant": "bench", "replicas": replicas}
    httpx.post(f"{url}/v1/deployments", json=body, headers=headers).raise_for_status()

    def healthy() -> bool:
        found = httpx.get(f"{url}/v1/deployments/mlp", headers=headers).json()
        return bool(found["versions"][0]["healthy_replicas"] >= replicas)

    wait(healthy, 180, "the aicluster deployment")
    return headers


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args()

    from ray import serve

    from aicluster.runtime import EmbeddedCluster, embedded_topology
    from aicluster.runtime.sandbox.bwrap import SandboxConfig, probe
    from aicluster.serve.sandboxed import sandbox_options

    work = Path(tempfile.mkdtemp(prefix="serve-overhead-"))
    cluster = EmbeddedCluster(embedded_topology(nodes=2, gpus_per_node=1, cpus=4))
    cluster.start()
    cluster.connect()
    try:
        serve_port, api_port = free_port(), free_port()
        serve.start(
            proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": serve_port}
        )
        artifact = build_mlp(work / "artifact")
        serve.run(bare_app(str(artifact), args.replicas), name="bench-bare", route_prefix="/bare")
        bare_url = f"http://127.0.0.1:{serve_port}/bare"
        wait(lambda: httpx.post(bare_url, json=mlp_inputs()).status_code == 200, 60, "bare")
        targets = {"bare": (bare_url, {})}
        if probe() is None:  # the same replica, its model in a sandbox (uid: any unused one)
            options = sandbox_options(SandboxConfig().uid_last, str(work / "state"))
            app = bare_app(str(artifact), args.replicas, options, name="Sandboxed")
            serve.run(app, name="bench-sandboxed", route_prefix="/sandboxed")
            boxed_url = f"http://127.0.0.1:{serve_port}/sandboxed"
            wait(lambda: httpx.post(boxed_url, json=mlp_inputs()).status_code == 200, 60, "box")
            targets["sandboxed"] = (boxed_url, {})
        state = work / "state"
        state.mkdir(exist_ok=True)
        with aicluster_server(state, cluster.address, api_port):
            url = f"http://127.0.0.1:{api_port}"
            headers = setup_aicluster(state, url, artifact, args.replicas)
            targets["aicluster"] = (f"{url}/v1/models/mlp/predict", headers)
            report(args, targets)
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        cluster.shutdown()


def report(args: argparse.Namespace, targets: dict[str, tuple[str, dict[str, str]]]) -> None:
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores, shared)")
    print(f"{'conc':>4} {'target':>10} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'errors':>6}")
    for concurrency in args.concurrency:
        totals: dict[str, list[Round]] = {name: [] for name in targets}
        for _ in range(args.rounds):
            for name, (url, headers) in targets.items():
                totals[name].append(measure(url, headers, concurrency, args.seconds))
        merged = {name: _merge(rounds) for name, rounds in totals.items()}
        for name, result in merged.items():
            print(
                f"{concurrency:>4} {name:>10} {result.p(0.5):>8.2f} {result.p(0.99):>8.2f} "
                f"{result.rate:>8.1f} {result.errors:>6}"
            )
        bare = merged["bare"]
        for name in [name for name in merged if name != "bare"]:
            ours = merged[name]
            print(
                f"{concurrency:>4} {name} adds p50 {ours.p(0.5) - bare.p(0.5):+.2f} ms, "
                f"throughput ratio {100 * ours.rate / bare.rate:.0f}% "
                f"(median of rounds: {statistics.median(r.rate for r in totals[name]):.0f} "
                f"vs {statistics.median(r.rate for r in totals['bare']):.0f} req/s)"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def _merge(rounds: list[Round]) -> Round:
    merged = Round()
    for one in rounds:
        merged.latencies.extend(one.latencies)
        merged.errors += one.errors
        merged.seconds += one.seconds
    return merged


if __name__ == "__main__":
    main()
