"""Cluster topology: NVLink domain ⊂ node ⊂ rack ⊂ pod ⊂ cluster.

Pure data and a generator; parsing cluster files lives in :mod:`aicluster.core.clusterfile`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

__all__ = [
    "Cluster",
    "DomainLevel",
    "GpuPower",
    "LinkBandwidth",
    "Node",
    "NodeShape",
    "make_cluster",
]


class DomainLevel(IntEnum):
    """Topology levels, innermost first. A gang packs into the lowest level that fits it."""

    NVLINK = 0
    NODE = 1
    RACK = 2
    POD = 3
    CLUSTER = 4

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> DomainLevel:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(level.label for level in cls)
            raise ValueError(f"unknown topology level {text!r} (expected one of {names})") from None


@dataclass(frozen=True, slots=True)
class GpuPower:
    """Power draw of a node type (nodes are typed by their GPUs), in watts: each GPU idle and
    busy, the node's base (fans, NICs, disks) and each CPU, drawn while the node is on."""

    idle_watts: float = 60.0
    busy_watts: float = 300.0
    node_watts: float = 0.0
    cpu_watts: float = 0.0


@dataclass(frozen=True, slots=True)
class PowerBudget:
    """The most watts a part of the cluster may draw with its modelled busy power: the whole
    cluster (``racks`` None), one rack, or a named circuit feeding several racks."""

    name: str  # as a reason names it: "cluster", "rack r2", "circuit feed-a"
    racks: frozenset[str] | None
    watts: float

    def __post_init__(self) -> None:
        if not self.watts > 0:
            raise ValueError(f"{self.name}: power_budget_w must be positive")


@dataclass(frozen=True, slots=True)
class LinkBandwidth:
    """Bandwidth per GPU, in GB/s, of the link a gang's traffic crosses at each topology level:
    NVLink inside a domain, the node's interconnect (PCIe) between its domains, the rack's
    network between nodes, the pod's between racks, the cluster's between pods. The defaults:
    NVLink 2 (V100), PCIe 4.0 x16, 200 Gb/s InfiniBand per GPU, then 2:1 and 4:1 oversubscribed
    spines. The simulator's communication model reads them (:mod:`aicluster.sim.comm`)."""

    nvlink: float = 300.0
    node: float = 32.0
    rack: float = 25.0
    pod: float = 12.5
    cluster: float = 6.25

    def __post_init__(self) -> None:
        for level in DomainLevel:
            value = self.at(level)
            if not value > 0 or value == float("inf"):
                raise ValueError(
                    f"bandwidth.{level.label} must be a positive number, got {value!r}"
                )

    def at(self, level: DomainLevel) -> float:
        """The bandwidth of ``level``'s own link."""
        return (self.nvlink, self.node, self.rack, self.pod, self.cluster)[level]

    def spanning(self, level: DomainLevel) -> float:
        """The bandwidth of a gang spread over ``level``: its slowest link, since traffic
        between two of its GPUs crosses every level up to ``level`` (a rack's network is
        reached over the node's PCIe)."""
        return min(self.at(inner) for inner in DomainLevel if inner <= level)


@dataclass(frozen=True, slots=True)
class Node:
    """One machine: ``gpus`` GPUs of one type, split into NVLink domains of equal size."""

    name: str
    gpus: int
    gpu_type: str
    rack: str
    pod: str
    cpus: float = 64.0
    memory_gb: float = 512.0
    nvlink_domain_size: int = 0  # 0 means one NVLink domain spanning the whole node
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"node {self.name}: gpus cannot be negative")
        size = self.nvlink_size
        if self.gpus and self.gpus % size:
            raise ValueError(
                f"node {self.name}: nvlink_domain_size {size} does not divide {self.gpus} GPUs"
            )

    @property
    def nvlink_size(self) -> int:
        """GPUs per NVLink domain on this node (at least 1)."""
        return self.nvlink_domain_size or max(self.gpus, 1)

    @property
    def nvlink_domains(self) -> int:
        return self.gpus // self.nvlink_size if self.gpus else 0


@dataclass(frozen=True)
class Cluster:
    """An immutable set of nodes with their topology, the power model of each GPU type and the
    bandwidth of each level's links."""

    name: str
    nodes: tuple[Node, ...]
    power: Mapping[str, GpuPower] = field(default_factory=dict)
    bandwidth: LinkBandwidth = field(default_factory=LinkBandwidth)
    #: Power budgets (``power_budget_w`` of the cluster, its racks, its circuits); none: no check.
    budgets: tuple[PowerBudget, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise ValueError(f"duplicate node name {node.name!r}")
            seen.add(node.name)
        racks = {node.rack for node in self.nodes}
        for budget in self.budgets:
            unknown = sorted((budget.racks or frozenset()) - racks)
            if unknown:
                raise ValueError(f"{budget.name}: no rack named {', '.join(unknown)}")

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    def gpus_by_type(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for node in self.nodes:
            totals[node.gpu_type] = totals.get(node.gpu_type, 0) + node.gpus
        return totals

    def racks(self) -> dict[str, list[Node]]:
        return _group(self.nodes, lambda node: node.rack)

    def pods(self) -> dict[str, list[Node]]:
        return _group(self.nodes, lambda node: node.pod)

    def power_of(self, gpu_type: str) -> GpuPower:
        return self.power.get(gpu_type, GpuPower())


def _group(nodes: Iterable[Node], key: object) -> dict[str, list[Node]]:
    groups: dict[str, list[Node]] = {}
    for node in nodes:
        groups.setdefault(key(node), []).append(node)  # type: ignore[operator]
    return groups


@dataclass(frozen=True, slots=True)
class NodeShape:
    """What every node of a generated cluster has besides its GPU count: the GPUs' type, their
    NVLink domains (0: one spanning the node), CPUs, memory, and the GPU type's power draw."""

    gpu_type: str = "H100"
    nvlink_domain_size: int = 0
    cpus: float = 64.0
    memory_gb: float = 512.0
    power: GpuPower = field(default_factory=GpuPower)


def make_cluster(
    *,
    nodes: int,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 16,
    racks_per_pod: int = 8,
    shape: NodeShape | None = None,
    name: str | None = None,
) -> Cluster:
    """Generate a regular cluster of any size: ``nodes`` nodes of ``shape`` (default: 64 CPUs,
    512 GB and H100s, one NVLink domain a node) filled rack by rack, pod by pod."""
    if nodes <= 0 or nodes_per_rack <= 0 or racks_per_pod <= 0:
        raise ValueError("nodes, nodes_per_rack and racks_per_pod must be positive")
    made = shape or NodeShape()
    width = len(str(nodes - 1))
    generated = []
    for index in range(nodes):
        rack_index = index // nodes_per_rack
        pod_index = rack_index // racks_per_pod
        generated.append(
            Node(
                name=f"node-{index:0{width}d}",
                gpus=gpus_per_node,
                gpu_type=made.gpu_type,
                rack=f"rack-{rack_index}",
                pod=f"pod-{pod_index}",
                cpus=made.cpus,
                memory_gb=made.memory_gb,
                nvlink_domain_size=made.nvlink_domain_size,
            )
        )
    label = name or f"{nodes}x{gpus_per_node}-{made.gpu_type}"
    return Cluster(label, tuple(generated), {made.gpu_type: made.power})
