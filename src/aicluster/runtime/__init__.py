"""Ray adapters: the embedded cluster, node discovery, worker gangs, their logs and telemetry.

Every Ray call of aicluster lives here. See :mod:`aicluster.runtime.gang.launch` for the contract of
a gang and :mod:`aicluster.runtime.cluster.embedded` for the cluster ``aicluster up`` starts.
"""

from aicluster.runtime.cluster.discovery import ClusterView, NodeInfo, connect, discover
from aicluster.runtime.cluster.embedded import (
    DetachedCluster,
    EmbeddedCluster,
    embedded_topology,
    ray_start_command,
    read_detached,
    start_detached,
    stop_detached,
)
from aicluster.runtime.gang.handle import GangHandle, TelemetryCursor
from aicluster.runtime.gang.launch import GangError, GangStartTimeout, PlacementError, Runtime
from aicluster.runtime.gang.status import GangPhase, GangStatus, RankState, RankStatus
from aicluster.runtime.labels import (
    GPU_RESOURCE,
    LABEL_GPU_TYPE,
    LABEL_NODE,
    LABEL_NVLINK_DOMAIN_SIZE,
    LABEL_POD,
    LABEL_RACK,
    SIM_GPU_RESOURCE,
)
from aicluster.runtime.layout import NAMESPACE, GangSpec, RankSlot, rank_layout
from aicluster.runtime.rundir import LogChunk, RunDir

__all__ = [
    "GPU_RESOURCE",
    "LABEL_GPU_TYPE",
    "LABEL_NODE",
    "LABEL_NVLINK_DOMAIN_SIZE",
    "LABEL_POD",
    "LABEL_RACK",
    "NAMESPACE",
    "SIM_GPU_RESOURCE",
    "ClusterView",
    "DetachedCluster",
    "EmbeddedCluster",
    "GangError",
    "GangHandle",
    "GangPhase",
    "GangSpec",
    "GangStartTimeout",
    "GangStatus",
    "LogChunk",
    "NodeInfo",
    "PlacementError",
    "RankSlot",
    "RankState",
    "RankStatus",
    "RunDir",
    "Runtime",
    "TelemetryCursor",
    "connect",
    "discover",
    "embedded_topology",
    "rank_layout",
    "ray_start_command",
    "read_detached",
    "start_detached",
    "stop_detached",
]
