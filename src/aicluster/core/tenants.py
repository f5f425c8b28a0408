"""Tenants: GPU quotas per GPU type, borrowing limits, fair-share weights, CPU and memory caps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["UNLIMITED", "Tenant"]

#: Quota or borrowing limit meaning "no limit".
UNLIMITED = 1 << 40


@dataclass(frozen=True, slots=True)
class Tenant:
    """A team sharing the cluster.

    ``quota`` is the GPUs per GPU type the tenant is guaranteed (a missing type means 0 when the
    tenant has any quota at all, or unlimited when ``quota`` is empty). ``borrow_limit`` caps how
    many GPUs beyond its quota a tenant may borrow from others' idle quota (missing type: no cap).
    Borrowed GPUs can be reclaimed: their jobs are preempted when the owner needs its quota back.

    ``cpu_quota`` and ``memory_quota_gb`` cap the CPUs and memory the tenant's running jobs hold
    together (None: no cap). They are hard caps: nothing is borrowed beyond them, so a job that
    would pass one waits until the tenant's own jobs give some back.
    """

    name: str
    quota: Mapping[str, int] = field(default_factory=dict)
    borrow_limit: Mapping[str, int] = field(default_factory=dict)
    weight: float = 1.0
    cpu_quota: float | None = None
    memory_quota_gb: float | None = None

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"tenant {self.name}: weight must be positive")
        for kind, cap in (("cpu_quota", self.cpu_quota), ("memory_quota_gb", self.memory_quota_gb)):
            if cap is not None and cap < 0:
                raise ValueError(f"tenant {self.name}: {kind} is negative")
        for kind, amounts in (("quota", self.quota), ("borrow_limit", self.borrow_limit)):
            for gpu_type, amount in amounts.items():
                if amount < 0:
                    raise ValueError(f"tenant {self.name}: {kind}[{gpu_type}] is negative")

    @property
    def has_quota(self) -> bool:
        return bool(self.quota)

    @property
    def has_host_quota(self) -> bool:
        return self.cpu_quota is not None or self.memory_quota_gb is not None

    def quota_for(self, gpu_type: str) -> int:
        if not self.quota:
            return UNLIMITED
        return self.quota.get(gpu_type, 0)

    def borrow_limit_for(self, gpu_type: str) -> int:
        return self.borrow_limit.get(gpu_type, UNLIMITED)
