"""The serving gateway: picks a model version by traffic weight and calls its Serve replicas.

It runs inside the API server process (``POST /v1/models/{name}/predict``). The hot path reads
only memory: the deployments and their traffic (reloaded from the store every ``refresh_s`` and
at once after a change made through this server) and each application's running replicas
(from ``serve.status()``, refreshed in the background as often). So:

* no healthy replica of any weighted version → 503 at once; a call waiting on a version whose
  replicas all went away meanwhile is abandoned with 503 as soon as the view shows it;
* every call is bounded by ``timeout_s`` → 504;
* a replica that dies mid-request (``RayActorError``) → the call is retried once (Serve routes
  it to another replica);
* bad input (the model's ``ValueError``) → 422; any other model error → 500, counted as an
  error of that version.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aicluster.core import Clock
from aicluster.serve.replica import APP_PREFIX, DEPLOYMENT, app_name
from aicluster.serve.stats import ServingStats
from aicluster.store.serving import DeploymentRecord

__all__ = ["Answer", "Gateway", "Observer", "Route"]

log = logging.getLogger(__name__)

#: ``observer(tenant, name, version, inputs)``: called on the hot path after a version is
#: chosen (drift statistics); must be cheap and must not raise.
Observer = Callable[[str, str, int, Mapping[str, Any]], None]
#: How often a call waiting on replicas re-checks that its version still has one.
_WAIT_CHECK_S = 0.2


@dataclass(frozen=True, slots=True)
class Answer:
    """What the API answers: an HTTP status and a JSON body."""

    status: int
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Route:
    """One deployment as the hot path sees it: versions with traffic and their cumulative
    weights (for a weighted random pick), and every deployed version."""

    record: DeploymentRecord
    weighted: tuple[int, ...]
    cumulative: tuple[float, ...]

    @classmethod
    def of(cls, record: DeploymentRecord) -> Route:
        weighted, cumulative, total = [], [], 0.0
        for version, percent in sorted(record.traffic.items()):
            if percent > 0:
                total += percent
                weighted.append(version)
                cumulative.append(total)
        return cls(record, tuple(weighted), tuple(c / total for c in cumulative))

    @property
    def stable(self) -> int:
        """The version with the most traffic (the lowest on a tie): where a canary's failed
        request is retried."""
        traffic = self.record.traffic
        return min(self.weighted, key=lambda version: (-traffic[version], version))

    def pick(self, draw: float) -> int:
        """The version for a uniform draw in [0, 1)."""
        index = bisect.bisect_right(self.cumulative, draw)
        return self.weighted[min(index, len(self.weighted) - 1)]


class _NoReplica(Exception):
    pass


class Gateway:
    """Routes predictions to model versions. Thread-safe reads; one refresher thread."""

    def __init__(
        self,
        store: Any,
        stats: ServingStats,
        clock: Clock,
        *,
        refresh_s: float = 0.5,
        timeout_s: float = 30.0,
        seed: int = 0,
    ) -> None:
        self.store, self.stats, self.clock = store, stats, clock
        self.refresh_s, self.timeout_s = refresh_s, timeout_s
        self.observers: list[Observer] = []
        self._rng = random.Random(seed)
        self._routes: dict[tuple[str, str], Route] = {}
        self._running: dict[str, int] = {}  # app → RUNNING replicas, from serve.status()
        self._weighted: set[str] = set()  # apps of versions with traffic (not draining)
        self._health_at = 0.0
        self._handles: dict[str, Any] = {}
        self._warm: set[str] = set()  # apps whose handle has answered once
        self._warming: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the background view ------------------------------------------------------------------

    def start(self) -> None:
        """Load the view once, then keep refreshing it in a daemon thread. Idempotent."""
        if self._thread is not None:
            return
        self._refresh_safely()
        self._thread = threading.Thread(target=self._run, name="aicluster-gateway", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self._refresh_safely()

    def _refresh_safely(self) -> None:
        try:
            self.refresh_routes()
        except Exception as error:  # the database is away: keep serving the last view
            log.warning("cannot reload deployments (%s); serving the previous view", error)
        try:
            self.refresh_health()
        except Exception as error:
            log.warning("cannot read Serve's status (%s)", error)

    def refresh_routes(self) -> None:
        """Reload deployments and traffic from the store (call after changing them)."""
        routes = {(d.tenant, d.name): Route.of(d) for d in self.store.list_deployments(None)}
        weighted = {
            app_name(tenant, name, version)
            for (tenant, name), route in routes.items()
            for version in route.weighted
        }
        self._routes, self._weighted = routes, weighted  # readers see the old or the new view
        export = getattr(self.stats.metrics, "set_traffic", None)
        if export is not None:  # the traffic weight gauge (0..1) of every deployed version
            for (tenant, name), route in routes.items():
                for version, percent in route.record.traffic.items():
                    export(tenant, name, str(version), percent / 100.0)

    def refresh_health(self) -> None:
        """Read each aicluster application's RUNNING replicas from Serve; make their handles."""
        from ray import serve

        running: dict[str, int] = {}
        for name, app in serve.status().applications.items():
            if name.startswith(APP_PREFIX):
                deployment = app.deployments.get(DEPLOYMENT)
                states: dict[Any, int] = dict(deployment.replica_states) if deployment else {}
                running[name] = int(states.get("RUNNING", 0))
        self._running = running
        self._health_at = self.clock.now()
        for name, count in running.items():
            if name not in self._handles:
                self._handles[name] = serve.get_deployment_handle(DEPLOYMENT, name)
            if count and name not in self._warm and name not in self._warming:
                self._warming.add(name)
                threading.Thread(target=self._warm_up, args=(name,), daemon=True).start()

    def _warm_up(self, app: str) -> None:
        """One call through a new handle before it takes traffic: a handle's router learns its
        replicas on first use, which took tens of seconds under load; a version is routable
        (and a rolling update promotes it) only once this call has answered."""
        try:
            self._handles[app].check_health.remote().result(timeout_s=120)
            self._warm.add(app)
        except Exception as error:
            log.info("warming up %s failed (%s); retrying", app, error)
        finally:
            self._warming.discard(app)

    def healthy_replicas(self, tenant: str, name: str, version: int) -> int:
        """RUNNING replicas of a version at the last refresh (0 until its handle is warm)."""
        app = app_name(tenant, name, version)
        return self._running.get(app, 0) if app in self._warm else 0

    def route(self, tenant: str, name: str) -> Route | None:
        return self._routes.get((tenant, name))

    def tenants_serving(self, name: str) -> list[str]:
        """Tenants with a deployment called ``name`` (to resolve an unqualified request)."""
        return sorted(tenant for tenant, model in self._routes if model == name)

    # -- the hot path ---------------------------------------------------------------------------

    async def predict(self, tenant: str, name: str, inputs: Mapping[str, Any]) -> Answer:
        """Answer one prediction. Never raises; never waits longer than ``timeout_s``."""
        route = self._routes.get((tenant, name))
        if route is None or not route.weighted:
            return Answer(404, {"error": f"no deployment {name!r}"})
        version = self._choose(route, tenant, name)
        if version is None:
            return _unavailable(name, "no healthy replica")
        for observer in self.observers:
            try:
                observer(tenant, name, version, inputs)
            except Exception:  # an observer must never fail a request
                log.exception("serving observer failed")
        answer = await self._answer_and_record(tenant, name, version, inputs)
        # A canary's server error is retried once on the stable version, as a proxy's retry
        # policy retries a 5xx on another host: the canary is still judged by its failure
        # (recorded above), but the caller does not pay for it. Not after a 504: the deadline
        # is spent. Predictions are idempotent, so a retry is safe.
        if answer.status in (500, 503):  # the stable version is worked out only on a failure
            stable = route.stable
            if stable != version and self.healthy_replicas(tenant, name, stable) > 0:
                answer = await self._answer_and_record(tenant, name, stable, inputs)
        return answer

    async def _answer_and_record(
        self, tenant: str, name: str, version: int, inputs: Mapping[str, Any]
    ) -> Answer:
        started = time.perf_counter()
        answer = await self._answer(tenant, name, version, inputs)
        elapsed = time.perf_counter() - started
        ok = answer.status < 500
        self.stats.record(tenant, name, version, ok, elapsed, self.clock.now(), answer.status)
        return answer

    def _choose(self, route: Route, tenant: str, name: str) -> int | None:
        """A version by weight; if it has no running replica, another weighted one that has."""
        version = route.pick(self._rng.random())
        if self.healthy_replicas(tenant, name, version) > 0:
            return version
        for other in route.weighted:
            if self.healthy_replicas(tenant, name, other) > 0:
                return other
        self.stats.record(tenant, name, version, False, 0.0, self.clock.now(), 503)
        return None

    async def _answer(
        self, tenant: str, name: str, version: int, inputs: Mapping[str, Any]
    ) -> Answer:
        from ray.exceptions import RayActorError
        from ray.serve.exceptions import ReplicaUnavailableError

        app = app_name(tenant, name, version)
        deadline = time.monotonic() + self.timeout_s
        for attempt in (1, 2):
            try:
                result = await self._call(app, inputs, deadline)
            except (RayActorError, ReplicaUnavailableError) as error:
                if attempt == 2:  # the retry died too
                    return _unavailable(name, f"replica failed ({type(error).__name__})")
                continue
            except _NoReplica:
                return _unavailable(name, "no healthy replica")
            except TimeoutError:
                return Answer(504, {"error": f"model {name!r} did not answer in time"})
            except Exception as error:
                log.warning("model %s v%d failed: %r", name, version, error)
                return Answer(500, {"error": f"model {name!r} failed: {type(error).__name__}"})
            if "error" in result:
                return Answer(422, {"error": str(result["error"])})
            return Answer(200, {"model": name, "version": version, "outputs": result["outputs"]})
        raise AssertionError("unreachable")

    async def _call(self, app: str, inputs: Mapping[str, Any], deadline: float) -> dict[str, Any]:
        handle: Any = self._handles.get(app)
        if handle is None:
            handle = self._handles[app] = await asyncio.to_thread(_handle, app)
        response = handle.predict.remote(dict(inputs))
        task = asyncio.ensure_future(_await(response))
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait({task}, timeout=min(left, _WAIT_CHECK_S))
                if done:
                    return task.result()
                # Its replicas all went away while we waited (not a version draining after a
                # traffic change: Serve lets those finish what they hold).
                if app in self._weighted and self._running.get(app, 0) == 0:
                    raise _NoReplica
        finally:
            if not task.done():
                response.cancel()
                task.cancel()
                task.add_done_callback(_consume)


async def _await(response: Any) -> dict[str, Any]:
    result: dict[str, Any] = await response
    return result


def _consume(task: asyncio.Task[Any]) -> None:
    """Read an abandoned call's outcome (a cancellation), so asyncio does not log it."""
    if not task.cancelled():
        task.exception()


def _handle(app: str) -> Any:
    from ray import serve

    return serve.get_deployment_handle(DEPLOYMENT, app)


def _unavailable(name: str, why: str) -> Answer:
    return Answer(503, {"error": f"model {name!r} is unavailable: {why}; retry shortly"})
