"""Reconcile the store's desired deployments with Ray Serve applications (on the leader).

Desired: one application per version in each active deployment's traffic map (0% included)
that has a RUNNING service job (its replicas are jobs the scheduler places, see
:mod:`aicluster.serve.services`): one Serve replica per such job, pinned to the job's node and
holding what the job holds. ``reconcile`` creates missing applications, redeploys those whose
artifact or scaling changed (replicas, what each holds, their nodes), finishes rolling updates
whose new version is healthy, and deletes applications no longer wanted once ``drain_s`` has
passed (every gateway's view has moved off them by then; Serve's graceful shutdown then lets
their in-flight requests finish). Idempotent: a second call with nothing changed does nothing.
Only applications named ``aic-...`` are touched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aicluster.core import Clock
from aicluster.runtime.labels import LABEL_NODE, gpu_resource_of
from aicluster.serve.replica import (
    APP_PREFIX,
    DEPLOYMENT,
    app_name,
    fingerprint,
    replica_app,
    service_scaling,
)
from aicluster.serve.services import replica_host, service_key, service_replicas
from aicluster.store.errors import LeaseLost
from aicluster.store.serving import DeploymentRecord

__all__ = ["Deployer", "RayServe", "ServeBackend"]

log = logging.getLogger(__name__)


class ServeBackend(Protocol):
    """What the deployer asks of Ray Serve (the real one: :class:`RayServe`)."""

    def applications(self) -> dict[str, str | None]:
        """aicluster's applications → their fingerprint (None when unknown)."""
        ...

    def deploy(
        self,
        app: str,
        artifact_dir: str,
        scaling: dict[str, Any],
        sandbox: dict[str, Any] | None = None,
    ) -> None: ...

    def delete(self, app: str) -> None: ...

    def gpu_resources(self) -> dict[str, str]:
        """aicluster node name → the Ray resource counting its GPUs (``GPU`` or simulated)."""
        ...


class RayServe:
    """Ray Serve in the connected Ray cluster, started on first use. aicluster reaches its
    applications through handles, so Serve's HTTP proxy is off unless ``http_port`` (or
    ``AICLUSTER_SERVE_PORT``) asks for one, on the head node only (for benchmarks against a
    bare Serve deployment). An already running Serve instance is used as it is."""

    def __init__(self, http_port: int | None = None) -> None:
        port = os.environ.get("AICLUSTER_SERVE_PORT")
        self.http_port = http_port if http_port is not None else (int(port) if port else None)
        self._started = False

    def _serve(self) -> Any:
        from ray import serve

        if not self._started:
            if self.http_port is None:
                serve.start(proxy_location="Disabled")
            else:
                serve.start(
                    proxy_location="HeadOnly",
                    http_options={"host": "127.0.0.1", "port": self.http_port},
                )
            self._started = True
        return serve

    def applications(self) -> dict[str, str | None]:
        serve = self._serve()
        from ray.serve.context import _get_global_client

        names = [n for n in serve.status().applications if n.startswith(APP_PREFIX)]
        found: dict[str, str | None] = dict.fromkeys(names)
        try:  # the fingerprints (user_config); only Serve's detailed view has them
            client: Any = _get_global_client()
            details = client.get_serve_details()
        except Exception as error:
            log.warning("cannot read Serve's details (%s)", error)
            return found
        for name in names:
            app = details.get("applications", {}).get(name) or {}
            deployment = (app.get("deployments") or {}).get(DEPLOYMENT) or {}
            config = (deployment.get("deployment_config") or {}).get("user_config") or {}
            found[name] = config.get("fingerprint")
        return found

    def deploy(
        self,
        app: str,
        artifact_dir: str,
        scaling: dict[str, Any],
        sandbox: dict[str, Any] | None = None,
    ) -> None:
        serve = self._serve()
        target = serve.RunTarget(
            target=replica_app(artifact_dir, scaling, sandbox), name=app, route_prefix=None
        )
        serve.run_many([target], wait_for_applications_running=False)

    def delete(self, app: str) -> None:
        self._serve().delete(app, _blocking=False)

    def gpu_resources(self) -> dict[str, str]:
        import ray

        found: dict[str, str] = {}
        for entry in ray.nodes():  # type: ignore[no-untyped-call]
            name = (entry.get("Labels") or {}).get(LABEL_NODE)
            resource = gpu_resource_of(entry.get("Resources") or {})
            if entry.get("Alive") and name and resource:
                found[str(name)] = resource
        return found


@dataclass
class _Unwanted:
    since: float


class Deployer:
    """Makes Serve match the store. ``artifact_dir(record, version)`` resolves an artifact."""

    def __init__(
        self,
        store: Any,
        backend: ServeBackend,
        clock: Clock,
        *,
        healthy: Callable[[DeploymentRecord, int], bool],
        artifact_dir: Callable[[str, str, int], Path] | None = None,
        drain_s: float = 2.0,
        sandbox: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.store, self.backend, self.clock = store, backend, clock
        # tenant -> how its replicas sandbox the model's code (None: unsandboxed)
        self.sandbox = sandbox or (lambda tenant: None)
        self.healthy = healthy
        self.artifact_dir = artifact_dir or self._artifact_from_registry
        self.drain_s = drain_s
        self._deployed: dict[str, str | None] | None = None  # app → fingerprint we deployed
        # Asked just before every change to Serve: False once this server's leader lease is gone
        # (Serving.lead sets it), so a deposed leader that wakes up deploys and deletes nothing.
        self.confirm: Callable[[], bool] = lambda: True
        self._unwanted: dict[str, _Unwanted] = {}

    def reconcile(self, now: float | None = None) -> None:
        """One pass (see the module docstring). Raises what the store or Serve raise; the next
        pass retries."""
        now = self.clock.now() if now is None else now
        if self._deployed is None:  # a new leader: learn what is running
            self._deployed = self.backend.applications()
        records = self.store.list_deployments(None)
        # A replica per RUNNING service job, where the scheduler put it.
        placed = service_replicas(self.store.service_jobs()) if records else {}
        gpus = any(record.gpus for record in records)
        resources = self.backend.gpu_resources() if placed and gpus else {}
        wanted: set[str] = set()
        for record in records:
            for version in record.versions:
                app = app_name(record.tenant, record.name, version)
                on = placed.get(service_key(record.tenant, record.name, version))
                if not on:  # no replica admitted (Serve refuses 0): no application
                    continue
                wanted.add(app)
                scaling = service_scaling(replica_host(record), on, resources)
                self._ensure(app, record, version, scaling)
            self._promote(record)
        self._remove(set(self._deployed) - wanted, now)

    def forget(self) -> None:
        """Leadership lost: the next leader (maybe this one again) starts from Serve's state."""
        self._deployed = None
        self._unwanted.clear()

    def _ensure(
        self,
        app: str,
        record: DeploymentRecord,
        version: int,
        scaling: dict[str, Any],
    ) -> None:
        assert self._deployed is not None
        self._unwanted.pop(app, None)
        artifact = str(self.artifact_dir(record.tenant, record.name, version))
        sandbox = self.sandbox(record.tenant)
        wanted = fingerprint(artifact, scaling, sandbox)
        if self._deployed.get(app, "") == wanted:
            return
        if not self.confirm():
            raise LeaseLost(f"not deploying {app}: this server no longer leads")
        log.info("deploying %s (%s)", app, scaling)
        self.backend.deploy(app, artifact, scaling, sandbox)
        self._deployed[app] = wanted

    def _promote(self, record: DeploymentRecord) -> None:
        """A rolling update: once the new version is healthy, all traffic moves to it (the old
        version then drains and is removed)."""
        target = record.promote_to
        if target is None or not self.healthy(record, target):
            return
        self.store.set_traffic(
            record.tenant,
            record.name,
            {target: 100.0},
            "deployer",
            reason=f"rolling update: version {target} is healthy",
            expected_version=record.version,
        )

    def _remove(self, apps: set[str], now: float) -> None:
        assert self._deployed is not None
        for app in apps:
            unwanted = self._unwanted.setdefault(app, _Unwanted(now))
            if now - unwanted.since < self.drain_s:
                continue
            if not self.confirm():
                raise LeaseLost(f"not removing {app}: this server no longer leads")
            log.info("removing %s", app)
            self.backend.delete(app)
            self._deployed.pop(app, None)
            self._unwanted.pop(app, None)

    def _artifact_from_registry(self, tenant: str, name: str, version: int) -> Path:
        record = self.store.get_model_version(tenant, name, version)
        return Path(record.artifact_dir)
