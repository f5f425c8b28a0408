"""How an aicluster node is described to Ray, and read back: node labels and resources.

Every aicluster node is a Ray node labelled with its topology (``ray start --labels`` or
``labels=`` on a node of an embedded cluster). The scheduler's node name is the
``aicluster.io/node`` label, and a gang's bundles select their node by that label, so names stay
stable across Ray node restarts (Ray's node ids do not). GPUs are Ray's ``GPU`` resource on real
machines; nodes without GPUs declare a custom resource instead (Ray Train and torch would treat a
``GPU`` resource as a real device). Pure functions only: unit-tested without Ray.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aicluster.core import Node
from aicluster.core.numbers import ascii_int

__all__ = [
    "GPU_RESOURCE",
    "LABEL_GPU_TYPE",
    "LABEL_NODE",
    "LABEL_NVLINK_DOMAIN_SIZE",
    "LABEL_POD",
    "LABEL_PREFIX",
    "LABEL_RACK",
    "NO_METRICS_EXPORT",
    "RAY_ACCELERATOR_LABEL",
    "SIM_GPU_RESOURCE",
    "gpu_resource_of",
    "node_from_ray",
    "node_labels",
    "node_resources",
    "ray_start_command",
]

LABEL_PREFIX = "aicluster.io/"
LABEL_NODE = "aicluster.io/node"
LABEL_RACK = "aicluster.io/rack"
LABEL_POD = "aicluster.io/pod"
LABEL_GPU_TYPE = "aicluster.io/gpu-type"
#: GPUs per NVLink domain on the node (``0`` or absent: the whole node is one domain). NVLink
#: domains sit inside a node in the core model, so the size identifies them: domain ``i`` holds
#: GPUs ``[i * size, (i + 1) * size)``.
LABEL_NVLINK_DOMAIN_SIZE = "aicluster.io/nvlink-domain-size"
#: The label Ray sets itself on nodes with GPUs (``ray.io/accelerator-type``).
RAY_ACCELERATOR_LABEL = "ray.io/accelerator-type"

#: Ray's own GPU resource (real devices).
GPU_RESOURCE = "GPU"
#: The resource a node without GPUs declares for its simulated GPUs.
SIM_GPU_RESOURCE = "aicluster/gpu"

_GIB = float(1 << 30)


def node_labels(node: Node) -> dict[str, str]:
    """Ray node labels describing ``node``'s place in the topology (plus its own labels)."""
    labels = {str(key): str(value) for key, value in node.labels.items()}
    labels.update(
        {
            LABEL_NODE: node.name,
            LABEL_RACK: node.rack,
            LABEL_POD: node.pod,
            LABEL_GPU_TYPE: node.gpu_type,
            LABEL_NVLINK_DOMAIN_SIZE: str(node.nvlink_domain_size),
        }
    )
    return labels


def node_resources(node: Node, gpu_resource: str = SIM_GPU_RESOURCE) -> dict[str, float]:
    """Custom resources a Ray node for ``node`` declares (``GPU`` is passed as ``num_gpus``)."""
    if gpu_resource == GPU_RESOURCE or not node.gpus:
        return {}
    return {gpu_resource: float(node.gpus)}


def gpu_resource_of(resources: Mapping[str, float]) -> str | None:
    """Which resource counts a Ray node's GPUs: real ``GPU`` first, then the simulated one."""
    for name in (GPU_RESOURCE, SIM_GPU_RESOURCE):
        if resources.get(name, 0) > 0:
            return name
    return None


def node_from_ray(labels: Mapping[str, str], resources: Mapping[str, float]) -> Node | None:
    """The aicluster :class:`Node` a Ray node stands for, or None if it is not labelled as one.

    ``resources`` are the node's *total* resources (``ray.nodes()[i]["Resources"]``).
    """
    name = labels.get(LABEL_NODE)
    if not name:
        return None
    gpu_resource = gpu_resource_of(resources)
    gpus = int(resources.get(gpu_resource, 0)) if gpu_resource else 0
    gpu_type = labels.get(LABEL_GPU_TYPE) or labels.get(RAY_ACCELERATOR_LABEL) or "unknown"
    size_text = labels.get(LABEL_NVLINK_DOMAIN_SIZE, "0")
    nvlink_size = ascii_int(size_text) or 0
    if gpus and nvlink_size and gpus % nvlink_size:
        nvlink_size = 0  # a label that does not divide the GPUs Ray counts: one domain per node
    extra = {
        key: value
        for key, value in labels.items()
        if not key.startswith(LABEL_PREFIX) and not key.startswith("ray.io/")
    }
    return Node(
        name=name,
        gpus=gpus,
        gpu_type=gpu_type,
        rack=labels.get(LABEL_RACK, "rack-0"),
        pod=labels.get(LABEL_POD, "pod-0"),
        cpus=float(resources.get("CPU", 0.0)),
        memory_gb=round(float(resources.get("memory", 0.0)) / _GIB, 3),
        nvlink_domain_size=nvlink_size,
        labels=extra,
    )


#: Ray's system config that turns its metrics agent's export off: it serves every node's metrics
#: (actor names: every tenant's job ids) over HTTP without a token, to anyone on the node, jobs
#: included, on the node's address (Ray offers no setting to bind it elsewhere). aicluster
#: reads none of them.
NO_METRICS_EXPORT = {"enable_metrics_collection": False}


def ray_start_command(
    node: Node,
    *,
    head_address: str | None = None,
    port: int = 6379,
    gpu_resource: str = GPU_RESOURCE,
) -> list[str]:
    """The ``ray start`` command that makes this machine the aicluster node ``node``.

    The head when ``head_address`` is None (listening on ``port``), else a node joining it.
    Ray's metrics export is off (:data:`NO_METRICS_EXPORT`), and the head starts no autoscaler
    monitor (``--no-monitor``): aicluster's nodes are its own to power
    (``runtime/cluster/providers.py``), and the monitor's metrics port answers anyone without a
    token. No node runs Ray's log monitor, whose output no aicluster driver reads.
    """
    command = ["ray", "start"]
    if head_address is None:  # the head's system config is the cluster's
        config = f"--system-config={json.dumps(NO_METRICS_EXPORT)}"
        command += ["--head", f"--port={port}", config, "--no-monitor"]
    else:
        command += [f"--address={head_address}"]
    # No log monitor: it tails every worker's log for the drivers, and aicluster's drivers
    # connect with log_to_driver=False (discovery.connect); job output has its own files.
    command.append("--include-log-monitor=False")
    labels = ",".join(f"{key}={value}" for key, value in node_labels(node).items())
    command += [f"--labels={labels}", f"--num-cpus={int(node.cpus)}"]
    if gpu_resource == GPU_RESOURCE:
        command.append(f"--num-gpus={node.gpus}")
    resources = node_resources(node, gpu_resource)
    if resources:
        command.append(f"--resources={json.dumps(resources)}")
    return command
