"""``Serving``: what a control-plane server holds for model serving.

Every server runs a :class:`Gateway` (it answers predictions) and keeps :class:`ServingStats`;
the leader also runs the :class:`Deployer` and the registered ``leader_tasks`` (the canary
rollout controller) in a thread of their own, every ``tick_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aicluster.core import Clock
from aicluster.serve.deployer import Deployer, RayServe, ServeBackend
from aicluster.serve.gateway import Gateway
from aicluster.serve.services import ServiceScaler
from aicluster.serve.stats import MetricsSink, ServingStats
from aicluster.store.serving import DeploymentRecord

if TYPE_CHECKING:
    from aicluster.runtime.sandbox.bwrap import SandboxConfig

__all__ = ["LeaderTask", "Serving"]

log = logging.getLogger(__name__)

#: ``task(now)``: run on the leader every tick after the deployer (exceptions are logged).
LeaderTask = Callable[[float], None]


class Serving:
    """The serving side of one server: gateway and stats everywhere, deployer on the leader."""

    def __init__(
        self,
        store: Any,
        clock: Clock,
        *,
        backend: ServeBackend | None = None,
        metrics: MetricsSink | None = None,
        refresh_s: float = 0.5,
        timeout_s: float = 30.0,
        tick_s: float = 0.5,
        drain_s: float = 2.0,
        seed: int = 0,
        sandbox: SandboxConfig | None = None,
    ) -> None:
        self.store, self.clock, self.tick_s = store, clock, tick_s
        self.stats = ServingStats(metrics)
        self.gateway = Gateway(
            store, self.stats, clock, refresh_s=refresh_s, timeout_s=timeout_s, seed=seed
        )
        self.sandbox = sandbox
        self.deployer = Deployer(
            store,
            backend or RayServe(),
            clock,
            healthy=self.is_healthy,
            drain_s=drain_s,
            sandbox=self._sandbox_of,
        )
        # Every deployment's replicas are service jobs: keep their number as each version wants.
        self.leader_tasks: list[LeaderTask] = [ServiceScaler(store, self._load)]
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lease: Callable[[], bool] = lambda: True

    def start(self) -> None:
        """Start the gateway's background view (every server)."""
        self.gateway.start()

    def _sandbox_of(self, tenant: str) -> dict[str, Any] | None:
        """How ``tenant``'s replicas sandbox the model's code (None: unsandboxed)."""
        if self.sandbox is None or self.store.state_dir is None:
            return None
        from aicluster.serve.sandboxed import sandbox_options

        uid = self.store.tenant_uid(tenant, self.sandbox.uid_first, self.sandbox.uid_last)
        return sandbox_options(uid, str(self.store.state_dir))

    def _load(
        self, tenant: str, name: str, version: int, since: float, now: float
    ) -> tuple[float, float]:
        """A version's requests per second and mean latency (s) answered here since ``since``."""
        seen = self.stats.window(tenant, name, version, since, now)
        return seen.requests / max(1.0, now - since), seen.mean_latency_s

    def is_healthy(self, record: DeploymentRecord, version: int) -> bool:
        """Whether a version runs at least its minimum replica count (and at least one)."""
        running = self.gateway.healthy_replicas(record.tenant, record.name, version)
        return running >= max(1, record.replicas[0])

    def changed(self) -> None:
        """A deployment changed through this server: route by it now, and reconcile soon."""
        self.gateway.refresh_routes()
        self._wake.set()

    # -- leadership -----------------------------------------------------------------------------

    def lead(
        self, lease: Callable[[], bool] | None = None, confirm: Callable[[], bool] | None = None
    ) -> None:
        """This server became the leader: reconcile until :meth:`step_down`. Idempotent.
        ``lease`` is asked before every pass; ``confirm`` (which may ask the store for the
        lease's epoch) just before each Serve deployment or deletion."""
        if self._thread is not None:
            return
        self._lease = lease or (lambda: True)
        self.deployer.confirm = confirm or self._lease
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="aicluster-serving", daemon=True)
        self._thread.start()

    def step_down(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.deployer.forget()

    def shutdown(self) -> None:
        self.step_down()
        self.gateway.stop()

    def tick(self) -> None:
        """One leader pass: the deployer, then every leader task; then route by the result."""
        now = self.clock.now()
        try:
            self.deployer.reconcile(now)
        except Exception:
            log.exception("serving reconcile failed; retrying next tick")
        for task in list(self.leader_tasks):
            try:
                task(now)
            except Exception:
                log.exception("serving leader task %r failed", task)
        try:
            self.gateway.refresh_routes()
        except Exception as error:
            log.warning("cannot reload deployments (%s)", error)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._lease():
                self.tick()
            self._wake.wait(self.tick_s)
            self._wake.clear()
