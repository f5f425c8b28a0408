"""Read the Ray cluster's nodes as aicluster :class:`~aicluster.core.Node` objects, with health.

Only Ray nodes labelled ``aicluster.io/node`` are aicluster nodes (a GPU-less head machine of a
multi-machine cluster need not be one). Dead nodes stay visible so the control loop can react to
them; the :class:`~aicluster.core.Cluster` handed to the scheduler holds the alive ones only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import ray

from aicluster.core import Cluster, Node
from aicluster.runtime.labels import gpu_resource_of, node_from_ray
from aicluster.runtime.layout import NAMESPACE

__all__ = ["ClusterView", "NodeInfo", "connect", "discover"]


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One aicluster node as Ray sees it now."""

    node: Node
    alive: bool
    ray_node_id: str
    address: str
    resources: Mapping[str, float] = field(default_factory=dict)
    available: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def gpu_resource(self) -> str | None:
        """The Ray resource counting this node's GPUs (``GPU`` or the simulated one)."""
        return gpu_resource_of(self.resources)


@dataclass(frozen=True)
class ClusterView:
    """A snapshot of the Ray cluster: every aicluster node by name (alive wins over dead)."""

    nodes: Mapping[str, NodeInfo]
    name: str = "ray"

    @property
    def cluster(self) -> Cluster:
        """The alive nodes, as the scheduler's :class:`Cluster` (sorted by name)."""
        alive = sorted(
            (info.node for info in self.nodes.values() if info.alive), key=lambda node: node.name
        )
        return Cluster(self.name, tuple(alive))

    def health(self) -> dict[str, bool]:
        """Node name to alive."""
        return {name: info.alive for name, info in self.nodes.items()}

    def alive(self, name: str) -> bool:
        info = self.nodes.get(name)
        return info is not None and info.alive


def connect(address: str | None = None, *, namespace: str = NAMESPACE) -> None:
    """Connect this process to a Ray cluster as a driver in aicluster's namespace. Idempotent.

    ``address`` is the GCS address (``host:port``) or None for ``RAY_ADDRESS``. Raises
    ``RuntimeError`` when already connected in another namespace. Worker output is not echoed
    here (it goes to the gang's run directory).
    """
    if ray.is_initialized():
        current = ray.get_runtime_context().namespace
        if current != namespace:
            raise RuntimeError(f"already connected to Ray in namespace {current!r}")
        return
    ray.init(
        address=address or "auto",
        namespace=namespace,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )


def discover(name: str = "ray") -> ClusterView:
    """Ask Ray (connected already) for its nodes; skips nodes without the aicluster node label."""
    found: dict[str, NodeInfo] = {}
    available = _available_by_node()
    for entry in ray.nodes():  # type: ignore[no-untyped-call]
        labels = {str(k): str(v) for k, v in (entry.get("Labels") or {}).items()}
        resources = {str(k): float(v) for k, v in (entry.get("Resources") or {}).items()}
        node = node_from_ray(labels, resources)
        if node is None:
            continue
        info = NodeInfo(
            node=node,
            alive=bool(entry.get("Alive")),
            ray_node_id=str(entry.get("NodeID", "")),
            address=str(entry.get("NodeManagerAddress", "")),
            resources=resources,
            available=available.get(str(entry.get("NodeID", "")), {}),
            labels=labels,
        )
        previous = found.get(node.name)
        if previous is None or (info.alive and not previous.alive):
            found[node.name] = info
    return ClusterView(found, name)


def _available_by_node() -> dict[str, dict[str, float]]:
    # Informative only (the scheduler keeps its own accounting): Ray's DeveloperAPI for it.
    from ray._private.state import available_resources_per_node

    raw = available_resources_per_node()  # type: ignore[no-untyped-call]
    return {str(k): {str(r): float(v) for r, v in res.items()} for k, res in raw.items()}
