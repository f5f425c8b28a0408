"""Every deployment's replicas are jobs of kind ``service`` that the scheduler places.

Serve does not decide a deployment's replicas: every replica is a job in the store, of the
deployment's tenant, asking what the deployment says one replica holds (its GPUs, ``aicluster
serve M:V --gpus 1``, maybe none; its CPUs and memory, ``--cpus 1 --memory-gb 2``), with the
priority class and preemptibility of the configuration's ``serving:`` section. The scheduler
admits, queues (over a GPU, CPU or memory quota: ``aicluster why`` says so) and preempts them
like any job; the control loop marks an admitted one RUNNING without launching a gang
(``control.loop.attempts``), and the deployer runs one Serve replica per RUNNING service job of a
version, on the node the scheduler chose (:func:`service_replicas`).

:class:`ServiceScaler` (a leader task of ``Serving``) keeps the jobs matching what each version
wants: it submits jobs for missing replicas and cancels extra ones, and those of versions or
deployments no longer served. What a version wants (:meth:`ServiceScaler.wanted`): a fixed
count, or with an autoscaling range the replicas its load needs by Little's law (requests in
flight = arrival rate × mean latency over the last ``LOAD_WINDOW_S``, divided by
``target_ongoing_requests``), within the range and never below 1; more at once, fewer only
after the load has stayed lower for the configuration's ``serving.scale_down_after_s``. The
load is what this server's gateway answered (statistics are per process, as for canary
analysis).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aicluster.configuration import Configuration, ServingSection, parse_configuration
from aicluster.core import ConfigError, IllegalTransition, JobSpec, JobState
from aicluster.store import JobRecord, NotFound, StaleState, placement_from_json
from aicluster.store.serving import DeploymentRecord

__all__ = [
    "DOWNSCALE_AFTER_S",
    "LOAD_WINDOW_S",
    "SERVICE_ACTOR",
    "Load",
    "ReplicaResources",
    "ServiceScaler",
    "replica_host",
    "replica_spec",
    "replicas_for_load",
    "service_key",
    "service_replicas",
    "service_spec",
    "wanted_replicas",
]

log = logging.getLogger(__name__)

#: Who submits and cancels service jobs (events, ``submitted_by``).
SERVICE_ACTOR = "serving"
#: A service job's name: ``svc-<model>.v<version>`` cut to the job-name limit.
_NAME_LIMIT = 63
#: The module a service job's spec names. The control loop never runs it (a service has no
#: gang); a spec needs an entrypoint or a module, and this one says what the job is.
_MODULE = "aicluster.serve.replica"


def service_key(tenant: str, name: str, version: int) -> tuple[str, str, int]:
    return (tenant, name, version)


def _key_of(job: JobRecord) -> tuple[str, str, int] | None:
    service = job.service or {}
    try:
        return service_key(job.tenant, str(service["model"]), int(service["version"]))
    except (KeyError, TypeError, ValueError):
        return None


#: Seconds of a version's traffic its load is judged on.
LOAD_WINDOW_S = 10.0
#: How long the load must want fewer replicas before one is given back, unless the
#: configuration's ``serving.scale_down_after_s`` says otherwise.
DOWNSCALE_AFTER_S = ServingSection().scale_down_after_s

#: ``load(tenant, model, version, since, now)``: (requests per second, mean latency in s).
Load = Callable[[str, str, int, float, float], tuple[float, float]]


def wanted_replicas(record: DeploymentRecord) -> int:
    """Replicas a version of a deployment asks the scheduler for without load: its
    scaling's minimum, and at least one (a version with no replica could never serve nor be
    promoted)."""
    return max(1, record.replicas[0])


def replicas_for_load(record: DeploymentRecord, rate: float, latency_s: float) -> int:
    """Replicas that keep ``target_ongoing_requests`` in flight on each at ``rate`` requests per
    second of ``latency_s`` each (Little's law), within the scaling's range, at least one."""
    low, high = wanted_replicas(record), max(1, record.replicas[1])
    auto = record.scaling.get("autoscaling") or {}
    target = float(auto.get("target_ongoing_requests", 0.0))
    if target <= 0:
        return low
    in_flight = max(0.0, rate) * max(0.0, latency_s)
    # A hair under a whole number is that number: float noise must not add a replica.
    needed = math.ceil(in_flight / target - 1e-9)
    return max(low, min(high, needed))


#: (GPUs, CPUs, memory in GB) of one replica.
ReplicaResources = tuple[int, float, float]


def service_spec(record: DeploymentRecord, version: int, serving: ServingSection) -> JobSpec:
    """The spec of one replica of ``record``'s ``version`` (see :func:`replica_spec`)."""
    return replica_spec(record.tenant, record.name, version, replica_host(record), serving)


def replica_host(record: DeploymentRecord) -> ReplicaResources:
    """What one replica of ``record`` holds: (GPUs, CPUs, memory in GB)."""
    return (record.gpus, record.cpus, record.memory_gb)


def replica_spec(
    tenant: str, name: str, version: int, holds: ReplicaResources, serving: ServingSection
) -> JobSpec:
    """The spec of one replica of ``tenant``'s ``name`` ``version``: its GPUs, CPUs and memory,
    the configuration's priority class and preemptibility; a replica is one worker on one
    node."""
    gpus, cpus, memory_gb = holds
    return JobSpec.model_validate(
        {
            "name": f"svc-{name}.v{version}"[:_NAME_LIMIT],
            "tenant": tenant,
            "module": _MODULE,
            "resources": {"gpus": gpus, "cpus": float(cpus), "memory_gb": float(memory_gb)},
            "priority": serving.priority,
            "preemptible": serving.preemptible,
            "max_domain": "node",
        }
    )


def service_replicas(jobs: Iterable[JobRecord]) -> dict[tuple[str, str, int], Counter[str]]:
    """Per (tenant, model, version): the nodes its RUNNING service jobs hold, with counts."""
    found: dict[tuple[str, str, int], Counter[str]] = {}
    for job in jobs:
        key = _key_of(job)
        if key is None or job.state is not JobState.RUNNING or not job.placement:
            continue
        nodes = found.setdefault(key, Counter())
        for node in _placement_nodes(job.placement):
            nodes[node] += 1
    return found


def _holds(job: JobRecord) -> ReplicaResources:
    resources = job.spec.resources
    return (resources.gpus, resources.cpus, resources.memory_gb)


def _placement_nodes(placement: Mapping[str, Any]) -> list[str]:
    """The nodes a placement (as stored) holds: one for a replica (one worker)."""
    try:
        return sorted({slot.node for slot in placement_from_json(placement).slots})
    except (KeyError, TypeError, ValueError):  # written by the loop; a tripwire, not a path
        return []


class ServiceScaler:
    """Submits and cancels service jobs so each served version of every deployment has as
    many live ones (PENDING or placed) as :meth:`wanted` says. Run on the leader only."""

    def __init__(self, store: Any, load: Load | None = None) -> None:
        self.store, self.load = store, load
        self._config_id: int | None = None
        self._serving = ServingSection()
        self._wanted: dict[tuple[str, str, int], int] = {}  # what each version was given
        self._lower_since: dict[tuple[str, str, int], float] = {}

    def __call__(self, now: float) -> None:
        self.reconcile(now)

    def wanted(
        self,
        record: DeploymentRecord,
        version: int,
        now: float,
        scale_down_after_s: float = DOWNSCALE_AFTER_S,
    ) -> int:
        """The replicas ``version`` asks for now (see the module docstring)."""
        key = service_key(record.tenant, record.name, version)
        if self.load is None or not record.scaling.get("autoscaling"):
            self._wanted[key] = wanted_replicas(record)
            return self._wanted[key]
        rate, latency_s = self.load(*key, now - LOAD_WINDOW_S, now)
        needed = replicas_for_load(record, rate, latency_s)
        current = self._wanted.get(key, wanted_replicas(record))
        low, high = wanted_replicas(record), max(1, record.replicas[1])
        current = max(low, min(high, current))  # the range may have changed
        if needed < current:  # fewer only once the load has stayed lower long enough
            lower_since = self._lower_since.setdefault(key, now)
            if now - lower_since < scale_down_after_s:
                self._wanted[key] = current
                return current
        self._lower_since.pop(key, None)
        self._wanted[key] = needed
        return needed

    def serving_section(self) -> ServingSection:
        """The ``serving:`` section of the configuration applied in the store (re-read when a
        newer one is applied; the defaults without one)."""
        newest = self.store.current_config_id()
        if newest != self._config_id:
            record = self.store.current_config()
            configuration = Configuration()
            if record is not None:
                try:
                    configuration = parse_configuration(record.text, record.source)[0]
                except ConfigError as error:  # validated when applied; keep what we had
                    log.error("cannot read configuration %s (%s)", newest, error)
                    self._config_id = newest
                    return self._serving
            self._serving, self._config_id = configuration.serving, newest
        return self._serving

    def reconcile(self, now: float) -> None:
        scale_down_after_s = self.serving_section().scale_down_after_s
        wanted: dict[tuple[str, str, int], tuple[DeploymentRecord, int]] = {}
        for record in self.store.list_deployments(None):
            for version in record.versions:
                wanted[service_key(record.tenant, record.name, version)] = (record, version)
        live: dict[tuple[str, str, int], list[JobRecord]] = {}
        for job in self.store.service_jobs():
            key = _key_of(job)
            if key is not None:
                live.setdefault(key, []).append(job)
        for key, jobs in live.items():
            if key not in wanted:
                self._cancel(jobs, f"{key[1]} v{key[2]} is no longer served")
        for key, (record, version) in wanted.items():
            jobs = [job for job in live.get(key, []) if job.cancel_requested_at is None]
            count = self.wanted(record, version, now, scale_down_after_s)
            self._match(record, version, jobs, count)
        for key in set(self._wanted) - set(wanted):
            self._wanted.pop(key, None)
            self._lower_since.pop(key, None)

    def _match(
        self, record: DeploymentRecord, version: int, jobs: list[JobRecord], count: int
    ) -> None:
        holds = replica_host(record)
        same = [job for job in jobs if _holds(job) == holds]
        stale = [job for job in jobs if _holds(job) != holds]
        if stale:  # the deployment now asks other resources per replica
            gpus, cpus, memory_gb = holds
            why = f"the replicas now ask {gpus} GPUs, {cpus:g} CPUs and {memory_gb:g} GB"
            self._cancel(stale, why)
        if len(same) > count:  # fewer wanted: give back the queued ones first, newest first
            extra = sorted(same, key=lambda j: (j.state is not JobState.PENDING, -j.submitted_at))
            self._cancel(extra[: len(same) - count], "fewer replicas wanted")
        missing = count - len(same)
        serving = self.serving_section() if missing > 0 else self._serving
        for _ in range(missing):
            spec = service_spec(record, version, serving)
            service = {"model": record.name, "version": version}
            job, _created = self.store.submit_job(
                record.tenant, spec, SERVICE_ACTOR, service=service
            )
            log.info("asked for a replica of %s v%d: %s", record.name, version, job.id)

    def _cancel(self, jobs: Iterable[JobRecord], why: str) -> None:
        for job in jobs:
            try:
                self.store.cancel_job(job.tenant, job.id, SERVICE_ACTOR, reason=why)
            except (NotFound, StaleState, IllegalTransition):  # ended meanwhile
                continue
