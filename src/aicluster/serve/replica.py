"""The Ray Serve deployment that serves one model version: ``ModelReplica`` and its options.

Each model version is its own Serve application (``app_name``) holding one deployment of
``ModelReplica``; it is reached through Serve handles (no Serve HTTP route), so aicluster's
gateway decides which version answers each request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aicluster.core import names
from aicluster.runtime.labels import GPU_RESOURCE, LABEL_NODE, SIM_GPU_RESOURCE
from aicluster.store.serving import DEFAULT_REPLICA_CPUS, PROMOTE_KEY

__all__ = [
    "APP_PREFIX",
    "DEPLOYMENT",
    "ModelReplica",
    "app_name",
    "deployment_options",
    "fingerprint",
    "replica_app",
    "service_scaling",
]

#: Every Serve application aicluster manages starts with this (the deployer leaves others alone).
APP_PREFIX = "aic-"
#: The one deployment inside each application.
DEPLOYMENT = "ModelReplica"
_GIB = float(1 << 30)


def app_name(tenant: str, name: str, version: int) -> str:
    """``aic-<tenant>.<name>.v<version>``, the names encoded by :mod:`aicluster.core.names`
    (``team-a``'s ``tiny-gpt`` v1 is ``aic-team-a.tiny-gpt.v1``, ``a_b``'s is
    ``aic-a~5fb.tiny-gpt.v1``): distinct (tenant, name, version) never share an application,
    however they are spelled."""
    return f"{APP_PREFIX}{names.join(tenant, name)}{names.SEPARATOR}v{version}"


class ModelReplica:
    """One replica: loads the artifact (``aicluster.train.export.load_predictor``) and answers
    ``predict``. Bad input (``ValueError`` from the model) is returned as ``{"error": ...}`` so
    the gateway can answer 422 without treating it as a failure of the version; anything else
    raised is a failure (500).

    A model may define ``check_health()`` (raise when unhealthy): Serve calls it every health
    check period and replaces a replica that fails; a replica also refuses to start while it
    fails, so an unhealthy version has no running replica and the gateway answers 503 at once.
    """

    def __init__(self, artifact_dir: str, sandbox: dict[str, Any] | None = None) -> None:
        self.artifact_dir = artifact_dir
        if sandbox is not None:  # the model's code is the tenant's: in the tenant's sandbox
            from aicluster.serve.sandboxed import SandboxedPredictor

            self.predictor: Any = SandboxedPredictor(artifact_dir, sandbox)
            self.check_health()
            return
        try:  # replicas share few cores: one thread each keeps them from fighting
            import torch

            torch.set_num_threads(1)
        except ImportError:  # pragma: no cover - torch is a runtime dependency
            pass
        from aicluster.train.export import load_predictor

        self.predictor = load_predictor(Path(artifact_dir))
        self.check_health()

    def check_health(self) -> None:
        hook = getattr(self.predictor, "check_health", None)
        if hook is not None:
            hook()

    def predict(self, inputs: dict[str, Any]) -> dict[str, Any]:
        try:
            return {"outputs": self.predictor.predict(inputs)}
        except ValueError as error:
            return {"error": str(error) or "invalid input"}


def service_scaling(
    holds: tuple[int, float, float], nodes: Mapping[str, int], gpu_resources: Mapping[str, str]
) -> dict[str, Any]:
    """The scaling the deployer gives Serve for a deployment's version: a fixed count, one
    replica per RUNNING service job (``nodes``: node → its replicas), each holding what the
    scheduler placed (``holds``: GPUs, CPUs, memory in GB); GPUs are counted in the resource
    the nodes count them in (``GPU``, or the simulated one)."""
    gpus, cpus, memory_gb = holds
    scaling: dict[str, Any] = {
        "replicas": sum(nodes.values()),
        "gpus": gpus,
        "cpus": cpus,
        "memory_gb": memory_gb,
        "nodes": dict(sorted(nodes.items())),
    }
    if gpus:
        resource = next((gpu_resources[n] for n in sorted(nodes) if n in gpu_resources), None)
        scaling["gpu_resource"] = resource or SIM_GPU_RESOURCE
    return scaling


def _service_actor_options(scaling: Mapping[str, Any]) -> dict[str, Any]:
    """A service replica's actor: the GPUs, CPUs and memory the scheduler placed, and a label
    selector keeping it on the nodes the scheduler placed the version's service jobs on (as a
    training gang's bundles are pinned)."""
    actor: dict[str, Any] = {"num_cpus": float(scaling["cpus"])}
    if scaling["memory_gb"]:
        actor["memory"] = float(scaling["memory_gb"]) * _GIB
    gpus = float(scaling["gpus"])
    if gpus and scaling["gpu_resource"] == GPU_RESOURCE:
        actor["num_gpus"] = gpus
    elif gpus:
        actor["resources"] = {str(scaling["gpu_resource"]): gpus}
    nodes = sorted(scaling["nodes"])
    if nodes:
        actor["label_selector"] = {
            LABEL_NODE: nodes[0] if len(nodes) == 1 else f"in({','.join(nodes)})"
        }
    return actor


def deployment_options(scaling: dict[str, Any]) -> dict[str, Any]:
    """Serve options for ``scaling``: a fixed replica count and health checks every second.
    The deployer's scaling (:func:`service_scaling`) pins each replica, with what it holds, to
    the nodes the scheduler chose; a bare ``{"replicas": n}`` (a plain Serve deployment, as the
    serving overhead benchmark runs) asks the default CPUs per replica and lets Serve place."""
    options: dict[str, Any] = {
        "name": DEPLOYMENT,
        "ray_actor_options": {"num_cpus": DEFAULT_REPLICA_CPUS},
        "health_check_period_s": 1.0,
        "health_check_timeout_s": 5.0,
        # A removed version finishes what it has in flight, then stops.
        "graceful_shutdown_wait_loop_s": 0.5,
        "graceful_shutdown_timeout_s": 10.0,
        "max_ongoing_requests": 32,
    }
    options["num_replicas"] = int(scaling.get("replicas", 1))
    if "nodes" in scaling:  # the scheduler decided how many, where, and what each holds
        options["ray_actor_options"] = _service_actor_options(scaling)
        placed: Mapping[str, int] = scaling["nodes"]
        if len(placed) > 1:  # one selector for all: at most as many per node as placed there
            options["max_replicas_per_node"] = max(placed.values())
    return options


def fingerprint(
    artifact_dir: str, scaling: dict[str, Any], sandbox: dict[str, Any] | None = None
) -> str:
    """What decides whether a running application must be redeployed: the artifact, the
    scaling (replicas, what each holds, their nodes) and the sandbox."""
    wanted = {k: v for k, v in scaling.items() if k != PROMOTE_KEY}
    parts: list[Any] = [artifact_dir, wanted] + ([sandbox] if sandbox is not None else [])
    return json.dumps(parts, sort_keys=True)


def replica_app(
    artifact_dir: str, scaling: dict[str, Any], sandbox: dict[str, Any] | None = None
) -> Any:
    """The bound Serve application of one model version (its model's code in the tenant's
    sandbox when ``sandbox`` is given, see :mod:`aicluster.serve.sandboxed`)."""
    from ray import serve

    options = deployment_options({k: v for k, v in scaling.items() if k != PROMOTE_KEY})
    options["user_config"] = {"fingerprint": fingerprint(artifact_dir, scaling, sandbox)}
    deployment: Any = serve.deployment(_Reconfigurable)
    return deployment.options(**options).bind(artifact_dir, sandbox)


class _Reconfigurable(ModelReplica):
    """``ModelReplica`` accepting a ``user_config``: the deployer stores its fingerprint there, so
    a new leader can tell which running applications are already as wanted (redeploying an
    unchanged application would restart its replicas)."""

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.fingerprint = config.get("fingerprint")
