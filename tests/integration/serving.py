"""Reusable parts of the serving tests: a tiny model artifact, a serving API server on a real Ray
cluster, a fixed-rate HTTP load generator and a replica killer.

* :func:`register_mlp` exports a small torch MLP with ``aicluster.train.export.export_model``
  and registers it as the next version of a model. Its ``config`` steers it: ``fail_rate``
  (share of requests raising, i.e. 5xx), ``delay_ms`` (sleep per request) and ``unhealthy_flag``
  (a path: while it exists the replica fails its health checks and refuses to start).
* :func:`serving_server` starts ``python -m aicluster.server --ray-address ...`` (a real
  process: the gateway, the deployer and the control loop) with tenants and tokens.
* :class:`LoadGenerator` sends requests at a fixed rate from a thread (httpx, asyncio) and
  counts answers by status; ``retry=True`` allows one client retry per request.
* :func:`replica_actors` / :func:`kill_replica` find and ``ray.kill`` Serve replica actors;
  :func:`replica_nodes` and :func:`placed_nodes` say where replicas run and where the
  scheduler placed their service jobs.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from apiserver import TLS
from serverproc import ServerProcess, servers_cleanup, wait_for, write_tenants

from aicluster.store import Role, Store

#: The served model's code (also what the pipeline tests' training job exports).
MODEL_CODE = (Path(__file__).parent / "retrain_job" / "mlp.py").read_text()

INPUTS = 8


def mlp_inputs() -> dict[str, Any]:
    return {"x": [0.1 * i for i in range(INPUTS)]}


def build_mlp(directory: Path, drift: dict[str, Any] | None = None, **config: Any) -> Path:
    """Export the MLP artifact into ``directory`` (see the module docstring for ``config``),
    with ``drift`` as its model.json's drift reference."""
    import torch

    from aicluster.train.export import export_model

    code = directory.parent / f"{directory.name}-code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "mlp.py").write_text(MODEL_CODE)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(INPUTS, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    settings = {"inputs": INPUTS, "hidden": 16, "outputs": 2, **config}
    return export_model(
        net,
        entrypoint="mlp.py:load",
        config=settings,
        directory=directory,
        code_dir=code,
        drift=drift,
    )


def register_mlp(
    store: Store,
    tenant: str,
    name: str,
    work_dir: Path,
    drift: dict[str, Any] | None = None,
    **config: Any,
) -> int:
    """Build the MLP artifact and register it as the next version of ``tenant``'s ``name``."""
    source = build_mlp(work_dir / f"{tenant}-{name}-{time.monotonic_ns()}", drift, **config)
    record = store.register_model_version(
        tenant,
        name,
        source_dir=source,
        job_id=None,
        spec_hash=None,
        code_version="test",
        dataset_hash=None,
        metrics={},
        registered_by="test",
    )
    return int(record.version)


# -- a serving server on a real Ray cluster -------------------------------------------------------


@dataclass
class ServingServer:
    process: ServerProcess
    store: Store
    tokens: dict[str, str]
    work_dir: Path

    @property
    def url(self) -> str:
        return self.process.url

    def client(self, who: str = "admin", timeout_s: float = 30.0) -> httpx.Client:
        return self.process.client(self.tokens[who], timeout_s)

    def deploy(self, who: str, model: str, version: int, **scaling: Any) -> dict[str, Any]:
        with self.client(who) as client:
            response = client.post(
                "/v1/deployments", json={"model": model, "version": version, **scaling}
            )
        assert response.status_code == 200, response.text
        return dict(response.json())

    def deployment(self, who: str, model: str) -> dict[str, Any]:
        with self.client(who) as client:
            response = client.get(f"/v1/deployments/{model}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait_serving(self, who: str, model: str, version: int, timeout_s: float = 120.0) -> None:
        """Until ``version`` takes all of the model's traffic with every replica healthy."""

        def ready() -> bool:
            versions = self.deployment(who, model)["versions"]
            if [v["version"] for v in versions] != [version]:
                return False
            low = int(str(versions[0]["desired_replicas"]).split("-")[0])
            return int(versions[0]["healthy_replicas"]) >= max(1, low)

        wait_for(ready, timeout_s, f"{model} v{version} to serve", [self.process], need_alive=True)

    def undeploy_all(self, who: str) -> list[str]:
        """Delete every deployment ``who`` sees (through the API, as a user would): a test's
        models stop serving once it ends, not at the module's end. An idle Serve replica is not
        free (each holds a process with torch, answering health checks and pushing metrics), and
        a module's tests would otherwise add up a dozen of them. Returns the models deleted."""
        with self.client(who) as client:
            listed = client.get("/v1/deployments")
            assert listed.status_code == 200, listed.text
            models = sorted({str(d["name"]) for d in listed.json()})
            for model in models:
                gone = client.delete(f"/v1/deployments/{model}")
                assert gone.status_code in (204, 404), gone.text
        return models

    def service_jobs(self, tenant: str, model: str, who: str = "admin") -> list[dict[str, Any]]:
        """The service jobs (the replicas) of ``tenant``'s deployment of ``model``, newest
        first, as ``who`` sees them."""
        with self.client(who) as client:
            response = client.get("/v1/jobs", params={"tenant": tenant, "limit": 100})
        assert response.status_code == 200, response.text
        return [
            j
            for j in response.json()["jobs"]
            if j["kind"] == "service" and (j["service"] or {}).get("model") == model
        ]

    def predict(self, who: str, model: str, inputs: dict[str, Any] | None = None) -> httpx.Response:
        with self.client(who) as client:
            return client.post(f"/v1/models/{model}/predict", json=inputs or mlp_inputs())


@contextmanager
def serving_server(
    ray_address: str,
    work_dir: Path,
    tenants: tuple[str, ...] = ("a", "b"),
    quotas: dict[str, dict[str, Any]] | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[ServingServer]:
    """A control-plane server process with serving, tenants ``tenants`` and a member user per
    tenant (``user-<tenant>``); the test's own store handle registers models. ``quotas`` gives
    a tenant its ``quota`` and ``borrow_limit`` (as :func:`write_tenants` takes them; none by
    default); ``extra_args``, the server's own flags."""
    state = work_dir / "state"
    state.mkdir(parents=True, exist_ok=True)
    limits = {t: (quotas or {}).get(t, {"quota": {}}) for t in tenants}
    tenants_file = write_tenants(work_dir / "tenants.json", limits)
    process = ServerProcess(
        "serving",
        state,
        work_dir / "logs",
        ray_address=ray_address,
        tenants=tenants_file,
        extra_args=extra_args,
    )
    try:
        with servers_cleanup(process):
            process.start()
            process.wait_for(process.is_leader, 60, "the server to lead")
            store = Store.open(state)
            try:
                tokens = {"admin": (state / "admin.token").read_text().strip()}
                for tenant in tenants:
                    user = f"user-{tenant}"
                    store.create_user(user, "test")
                    store.grant_role(user, tenant, Role.MEMBER, "test")
                    tokens[user] = store.create_token(user, "test").token
                yield ServingServer(process, store, tokens, work_dir)
            finally:
                store.close()
    finally:
        remove_serve_applications()


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` in this process's environment (what a server process started inside reads),
    each variable as it was afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def remove_serve_applications() -> None:
    """Delete every Serve application left on the shared Ray cluster: they outlive the server
    process that deployed them, and their replicas hold the CPUs, memory and GPUs of their jobs
    on the nodes that later tests' gangs reserve."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.exceptions import RayServeException

    try:
        names = list(serve.status().applications)
    except RayServeException:  # Serve never started on the cluster
        return
    # All at once, then until every one is gone (what serve.delete does for one): their
    # replicas shut down side by side rather than one application after another.
    _get_global_client().delete_apps(names, blocking=True)  # type: ignore[union-attr]


# -- load -----------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    sent: int = 0
    # The final status per request: NO_ANSWER (the connection dropped or was refused) or
    # CLIENT_TIMEOUT (no answer within the client's time-out, which is above the gateway's own
    # bound: the server hung) besides HTTP codes. Every one but 200 is a lost request.
    codes: Counter[int] = field(default_factory=Counter)
    #: What each NO_ANSWER was (the client's exception), for a failure's message.
    dropped: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    latencies_s: list[float] = field(default_factory=list)
    slowest_s: float = 0.0

    @property
    def ok(self) -> int:
        return self.codes[200]

    @property
    def errors(self) -> int:
        return self.sent - self.ok

    @property
    def error_rate(self) -> float:
        return self.errors / self.sent if self.sent else 0.0

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def summary(self) -> str:
        return (
            f"sent {self.sent}, codes {dict(self.codes)}, retried {self.retried}, "
            f"p50 {self.percentile_ms(0.5):.1f} ms, p99 {self.percentile_ms(0.99):.1f} ms, "
            f"slowest {1000 * self.slowest_s:.0f} ms"
            + (f", no answer: {dict(self.dropped)}" if self.dropped else "")
        )


#: A request that got no HTTP answer: its connection dropped or was refused.
NO_ANSWER = 0
#: A request the client gave up on: no answer within ``CLIENT_TIMEOUT_S``.
CLIENT_TIMEOUT = -1
#: Above the gateway's bound on a call (30 s by default, then a 504): a slow answer on a loaded
#: machine is the server's to give, so a client time-out means the server hung, not that it was
#: slow.
CLIENT_TIMEOUT_S = 45.0


class LoadGenerator:
    """Open-loop load: request ``i`` is sent at ``start + i / rate`` whatever the answers, from
    a thread running its own event loop. ``retry``: one more try after a non-200 answer (after
    the ``Retry-After`` second of a 503)."""

    def __init__(
        self,
        url: str,
        token: str,
        path: str,
        body: dict[str, Any],
        rate: float,
        *,
        retry: bool = False,
        timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> None:
        self.url, self.path, self.rate, self.retry = url, path, rate, retry
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.body = json.dumps(body).encode()
        self.timeout_s = timeout_s
        self.result = LoadResult()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.achieved_rate = 0.0

    def __enter__(self) -> LoadGenerator:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=self.timeout_s + 60)  # those in flight finish (time-out each)

    async def _run(self) -> None:
        # Idle connections are given up after 2 s, before the server's keep-alive of 5 s
        # (uvicorn's default) closes them: at 5 s each (httpx's default) both expire together,
        # and a request sent on a connection the server is closing at that moment is dropped
        # (the client's race, not a request the server lost).
        limits = httpx.Limits(
            max_connections=64, max_keepalive_connections=64, keepalive_expiry=2.0
        )
        async with httpx.AsyncClient(
            base_url=self.url,
            headers=self.headers,
            timeout=self.timeout_s,
            limits=limits,
            verify=TLS,
        ) as client:
            tasks: set[asyncio.Task[None]] = set()
            started = time.monotonic()
            sent = 0
            while not self._stop.is_set():
                due = started + sent / self.rate
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._one(client))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            self.achieved_rate = sent / (time.monotonic() - started)
            if tasks:
                await asyncio.wait(tasks)

    async def _one(self, client: httpx.AsyncClient) -> None:
        self.result.sent += 1
        began = time.monotonic()
        code = await self._try(client)
        if code != 200 and self.retry:
            self.result.retried += 1
            if code == 503:  # as a client should: after Retry-After (1 s)
                await asyncio.sleep(1.0)
            code = await self._try(client)
        elapsed = time.monotonic() - began
        self.result.codes[code] += 1
        self.result.latencies_s.append(elapsed)
        self.result.slowest_s = max(self.result.slowest_s, elapsed)

    async def _try(self, client: httpx.AsyncClient) -> int:
        try:
            response = await client.post(self.path, content=self.body)
        except httpx.TimeoutException:
            return CLIENT_TIMEOUT
        except httpx.HTTPError as error:
            self.result.dropped[f"{type(error).__name__}: {error}"[:120]] += 1
            return NO_ANSWER
        return response.status_code


def capacity(url: str, token: str, path: str, seconds: float = 3.0, clients: int = 4) -> float:
    """Answers per second with ``clients`` closed-loop clients: what the machine sustains now
    (load tests set their open-loop rate below it, so they measure failures, not overload)."""
    body = json.dumps(mlp_inputs()).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    answered = [0] * clients
    deadline = time.monotonic() + seconds

    def run(index: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30, verify=TLS) as client:
            while time.monotonic() < deadline:
                if client.post(path, content=body).status_code == 200:
                    answered[index] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(answered) / seconds


# -- Serve replicas -------------------------------------------------------------------------------


def replicas(app: str) -> list[dict[str, Any]]:
    """The RUNNING replicas of a Serve application (Serve's details: actor name, node id)."""
    from ray.serve.context import _get_global_client

    from aicluster.serve import DEPLOYMENT

    details: Any = _get_global_client().get_serve_details()  # type: ignore[union-attr]
    application = details.get("applications", {}).get(app) or {}
    deployment = (application.get("deployments") or {}).get(DEPLOYMENT) or {}
    return [r for r in deployment.get("replicas", []) if r.get("state") == "RUNNING"]


def replica_nodes(app: str) -> Counter[str]:
    """The aicluster nodes (their labels) the RUNNING replicas of a Serve application run on."""
    return Counter(ray_node_name(str(r["node_id"])) for r in replicas(app))


def placed_nodes(jobs: list[dict[str, Any]]) -> Counter[str]:
    """The nodes the scheduler placed the RUNNING ones of ``jobs`` (service jobs) on."""
    running = [j for j in jobs if j["state"] == "RUNNING"]
    return Counter(slot[0] for j in running for slot in j["placement"]["slots"])


def ray_node_name(node_id: str) -> str:
    """The aicluster node name (its label) of a Ray node id."""
    import ray

    from aicluster.runtime.labels import LABEL_NODE

    for entry in ray.nodes():  # type: ignore[no-untyped-call]
        if entry.get("NodeID") == node_id:
            return str((entry.get("Labels") or {}).get(LABEL_NODE))
    raise AssertionError(f"no Ray node {node_id}")


def replica_actors(app: str) -> list[str]:
    """Actor names (namespace ``serve``) of the RUNNING replicas of a Serve application."""
    return [str(r["actor_name"]) for r in replicas(app)]


def kill_replica(app: str, rng: random.Random) -> str | None:
    """``ray.kill`` one replica of ``app`` chosen by ``rng``; returns its name (None if none)."""
    import ray

    names = replica_actors(app)
    if not names:
        return None
    name = rng.choice(sorted(names))
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return name
