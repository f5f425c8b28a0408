"""Pure domain types: resources, topology, tenants, jobs, plans and the Clock protocol.

Nothing here does I/O, reads the wall clock or draws unseeded random numbers.
"""

from aicluster.core.clock import Clock, ManualClock
from aicluster.core.configfile import ConfigError, parse_cluster, parse_tenants
from aicluster.core.job import (
    PRIORITY_CLASSES,
    TERMINAL_STATES,
    IllegalTransition,
    Job,
    JobState,
    Parallelism,
    check_transition,
    priority_of,
)
from aicluster.core.jobspec import (
    JobSpec,
    JobSpecError,
    ParallelismSpec,
    ResourcesSpec,
    SpecProblem,
    jobspec_from_mapping,
    parse_jobspec,
)
from aicluster.core.plan import (
    Admit,
    PendingCode,
    PendingReason,
    Placement,
    Plan,
    Preempt,
    Slot,
    VictimKind,
)
from aicluster.core.resources import ANY_GPU_TYPE, Resources
from aicluster.core.tenants import UNLIMITED, Tenant
from aicluster.core.topology import (
    Cluster,
    DomainLevel,
    GpuPower,
    LinkBandwidth,
    Node,
    NodeShape,
    make_cluster,
)

__all__ = [
    "ANY_GPU_TYPE",
    "PRIORITY_CLASSES",
    "TERMINAL_STATES",
    "UNLIMITED",
    "Admit",
    "Clock",
    "Cluster",
    "ConfigError",
    "DomainLevel",
    "GpuPower",
    "IllegalTransition",
    "Job",
    "JobSpec",
    "JobSpecError",
    "JobState",
    "LinkBandwidth",
    "ManualClock",
    "Node",
    "NodeShape",
    "Parallelism",
    "ParallelismSpec",
    "PendingCode",
    "PendingReason",
    "Placement",
    "Plan",
    "Preempt",
    "Resources",
    "ResourcesSpec",
    "Slot",
    "SpecProblem",
    "Tenant",
    "VictimKind",
    "check_transition",
    "jobspec_from_mapping",
    "make_cluster",
    "parse_cluster",
    "parse_jobspec",
    "parse_tenants",
    "priority_of",
]
