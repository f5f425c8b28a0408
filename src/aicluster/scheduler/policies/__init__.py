"""Queue-order policies, registered by name: ``make_policy(config)`` picks ``config.queue``."""

from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.policies.base import QueuePolicy, registry
from aicluster.scheduler.policies.fair import FairPolicy
from aicluster.scheduler.policies.simple import FifoPolicy, PriorityPolicy, SjfPolicy, SrtfPolicy
from aicluster.scheduler.policies.tiresias import TiresiasPolicy

__all__ = [
    "FairPolicy",
    "FifoPolicy",
    "PriorityPolicy",
    "QueuePolicy",
    "SjfPolicy",
    "SrtfPolicy",
    "TiresiasPolicy",
    "make_policy",
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
