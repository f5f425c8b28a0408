"""Queue-order policies, registered by name: ``make_policy(config)`` picks ``config.queue``;
``make_state`` builds a scheduler state with the policy its configuration names."""

from aicluster.core import Cluster, Tenant
from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.policies.base import QueuePolicy, registry
from aicluster.scheduler.policies.fair import FairPolicy
from aicluster.scheduler.policies.simple import FifoPolicy, PriorityPolicy, SjfPolicy, SrtfPolicy
from aicluster.scheduler.policies.tiresias import TiresiasPolicy
from aicluster.scheduler.state import SchedulerState

__all__ = [
    "FairPolicy",
    "FifoPolicy",
    "PriorityPolicy",
    "QueuePolicy",
    "SjfPolicy",
    "SrtfPolicy",
    "TiresiasPolicy",
    "make_policy",
    "make_state",
    "names",
]


def names() -> list[str]:
    return sorted(registry)


def make_policy(config: SchedulerConfig) -> QueuePolicy:
    """The queue policy named by ``config.queue``; ValueError lists the known names."""
    try:
        factory = registry[config.queue]
    except KeyError:
        raise ValueError(
            f"unknown queue policy {config.queue!r} (known: {', '.join(names())})"
        ) from None
    return factory(config)


def make_state(
    cluster: Cluster,
    tenants: dict[str, Tenant] | None = None,
    config: SchedulerConfig | None = None,
) -> SchedulerState:
    """A :class:`SchedulerState` of ``cluster`` with the queue policy ``config`` names."""
    config = SchedulerConfig() if config is None else config
    tenants = {} if tenants is None else tenants
    return SchedulerState(cluster, tenants, config, make_policy(config))
