"""Admission: whether a tenant's quotas let a job start now.

GPUs per GPU type are guaranteed up to a tenant's quota and may be borrowed beyond it from
others' idle quota, up to a borrowing limit; CPUs and memory have hard caps. A cycle counts its
own decisions as it makes them (``usage_delta``, ``host_delta``: what its admissions add and
its preemptions take away), so that two jobs admitted in one cycle cannot both pass a limit that
only one of them fits under.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aicluster.core import Job, PendingCode, PendingReason
from aicluster.scheduler.state import SchedulerState

__all__ = ["Admission"]


@dataclass(slots=True)
class Admission:
    """One cycle's quota checks and the usage its decisions have added so far."""

    state: SchedulerState
    usage_delta: dict[tuple[str, str], int] = field(default_factory=dict)
    host_delta: dict[str, tuple[int, int]] = field(default_factory=dict)
    quotas_active: bool = field(init=False)
    host_quotas_active: bool = field(init=False)

    def __post_init__(self) -> None:
        # Tenants do not change during a cycle.
        self.quotas_active = self.state.quotas_active
        self.host_quotas_active = self.state.host_quotas_active

    def admissible_types(
        self, job: Job, types: list[str]
    ) -> tuple[list[str], PendingReason | None]:
        """Of the GPU types ``job`` may use (``types``), those its tenant's quota and borrowing
        limit let it start on now; or why none (a reason to wait)."""
        if self.host_quotas_active and job.needs_host:
            refusal = self.over_host_quota(job)
            if refusal is not None:
                return [], refusal
        if types and (not self.quotas_active or not job.total_gpus):
            return types, None
        if not types:
            return [], PendingReason(
                PendingCode.INFEASIBLE, f"no node in the cluster has GPU type {job.gpu_type}"
            )
        tenant = self.state.tenant(job.tenant)
        if not tenant.has_quota:
            return types, None
        allowed = [t for t in types if self.borrowed_after(job, t) <= tenant.borrow_limit_for(t)]
        if allowed:
            return allowed, None
        return [], self._over_gpu_quota(job, types[0])

    def _over_gpu_quota(self, job: Job, gpu_type: str) -> PendingReason:
        tenant = self.state.tenant(job.tenant)
        used = self.used(job.tenant, gpu_type)
        quota, limit = tenant.quota_for(gpu_type), tenant.borrow_limit_for(gpu_type)
        if limit == 0:
            return PendingReason(
                PendingCode.OVER_QUOTA,
                f"over quota: tenant {job.tenant} uses {used} of {quota} {gpu_type} GPUs and the "
                f"job needs {job.total_gpus}; borrowing is not allowed",
            )
        return PendingReason(
            PendingCode.BORROW_LIMIT,
            f"borrowing limit: tenant {job.tenant} uses {used} {gpu_type} GPUs (quota {quota}, "
            f"may borrow {limit}) and the job needs {job.total_gpus}",
        )

    def within_borrow_limits(self, job: Job, types: list[str]) -> bool:
        """Whether ``job`` stays within its tenant's borrowing limit on every type of ``types``."""
        if not self.quotas_active:
            return True
        limit = self.state.tenant(job.tenant).borrow_limit_for
        return all(self.borrowed_after(job, t) <= limit(t) for t in types)

    def over_host_quota(self, job: Job) -> PendingReason | None:
        """Why ``job`` waits for its tenant's CPU or memory cap, if it does."""
        tenant = self.state.tenant(job.tenant)
        cpus, memory = self._host_used(job.tenant)
        for label, cap, used, needed, scale in (
            ("CPUs", tenant.cpu_quota, cpus, job.total_millicpus, 1000),
            ("GB of memory", tenant.memory_quota_gb, memory, job.total_memory_mib, 1024),
        ):
            if cap is not None and used + needed > round(cap * scale):
                return PendingReason(
                    PendingCode.OVER_QUOTA,
                    f"over quota: tenant {job.tenant} uses {used / scale:g} of {cap:g} {label} "
                    f"and the job needs {needed / scale:g}",
                )
        return None

    def used(self, tenant: str, gpu_type: str) -> int:
        return self.state.used(tenant, gpu_type) + self.usage_delta.get((tenant, gpu_type), 0)

    def borrowed_after(self, job: Job, gpu_type: str) -> int:
        """GPUs the tenant would borrow in all if ``job`` started."""
        quota = self.state.tenant(job.tenant).quota_for(gpu_type)
        return max(0, self.used(job.tenant, gpu_type) + job.total_gpus - quota)

    def borrow_needed(self, job: Job, gpu_type: str) -> int:
        """GPUs ``job`` itself borrows beyond what the tenant borrows already."""
        if not self.quotas_active:
            return 0
        quota = self.state.tenant(job.tenant).quota_for(gpu_type)
        already = max(0, self.used(job.tenant, gpu_type) - quota)
        return self.borrowed_after(job, gpu_type) - already

    def count(self, job: Job, gpu_type: str, sign: int) -> None:
        """Count a decision of the cycle: ``job`` started (``sign`` 1) or preempted (-1)."""
        key = (job.tenant, gpu_type)
        self.usage_delta[key] = self.usage_delta.get(key, 0) + sign * job.total_gpus
        if job.needs_host:
            cpus, memory = self.host_delta.get(job.tenant, (0, 0))
            self.host_delta[job.tenant] = (
                cpus + sign * job.total_millicpus,
                memory + sign * job.total_memory_mib,
            )

    def _host_used(self, tenant: str) -> tuple[int, int]:
        cpus, memory = self.state.host_usage.get(tenant, (0, 0))
        added_cpus, added_memory = self.host_delta.get(tenant, (0, 0))
        return cpus + added_cpus, memory + added_memory
