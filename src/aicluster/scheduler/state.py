"""The scheduler's view of the world, kept up to date incrementally by a control loop.

A control loop (the live one or the simulator) owns one :class:`SchedulerState`: it reports
arrivals, starts, stops and node health; :func:`aicluster.scheduler.schedule` reads a snapshot of it
and returns a Plan; the loop applies the Plan with :meth:`SchedulerState.start` and
:meth:`SchedulerState.stop`. Pending jobs are kept in sorted *lanes* (same shape, same preemption
rights) so a cycle skips a whole lane once its head cannot be placed. The entries it keeps are
:mod:`.entries`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from aicluster.core import ANY_GPU_TYPE, Cluster, Job, Placement, Tenant
from aicluster.scheduler.budgets import Budgets
from aicluster.scheduler.config import SchedulerConfig
from aicluster.scheduler.entries import Lane, PendingEntry, Progress, RunningEntry, job_shape
from aicluster.scheduler.index import FreeIndex
from aicluster.scheduler.locality import DATA_CACHED_BYTES
from aicluster.scheduler.power import PowerManager
from aicluster.scheduler.wakeups import Wakeups

if TYPE_CHECKING:
    from aicluster.scheduler.policies.base import QueuePolicy

__all__ = ["SchedulerState", "Snapshot"]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scheduling cycle sees. Read-only by contract: the cycle changes nothing in it."""

    now: float
    state: SchedulerState

    @property
    def index(self) -> FreeIndex:
        return self.state.index

    @property
    def running(self) -> Mapping[str, RunningEntry]:
        return self.state.running

    @property
    def pending(self) -> Mapping[str, PendingEntry]:
        return self.state.pending


class SchedulerState:
    """Cluster capacity, running and pending jobs, and tenant usage, updated event by event.

    The queue policy is handed in (:func:`aicluster.scheduler.make_state` builds a state with
    the one ``config`` names): a policy reads the state, so the state never builds one."""

    # Not a dataclass: mypyc gives a dataclass's fields their types at import, and QueuePolicy
    # is imported here for type checking only (the policies import this module).
    def __init__(
        self,
        cluster: Cluster,
        tenants: dict[str, Tenant],
        config: SchedulerConfig,
        policy: QueuePolicy,
    ) -> None:
        self.cluster = cluster
        self.tenants = tenants
        self.config = config
        self.policy = policy
        random_seed = config.placement_seed if config.placement == "random" else None
        self.index = FreeIndex(self.cluster, random_seed=random_seed)
        self.index.host_shortcut = self.index.fit_shortcut = config.shortcuts
        self.index.locality = DATA_CACHED_BYTES in config.placement_preferences
        #: Power saving (``power:`` in the configuration), None when off: then no hook runs.
        self.power = None if config.power is None else PowerManager(self.index, config.power)
        #: The cluster file's power budgets, None when it gives none: then nothing is checked.
        self.budgets = Budgets(self.index) if cluster.budgets else None
        self.pending: dict[str, PendingEntry] = {}
        self.running: dict[str, RunningEntry] = {}
        self.lanes: dict[Lane, list[tuple[tuple[float, ...], int, str]]] = {}
        self.usage: dict[str, dict[str, int]] = {}
        #: Milli-CPUs and MiB of memory each tenant's running jobs hold (for its caps).
        self.host_usage: dict[str, tuple[int, int]] = {}
        self.node_jobs: list[dict[str, None]] = [{} for _ in self.cluster.nodes]
        self.capacity_by_type = self.cluster.gpus_by_type()
        self._default_tenants: dict[str, Tenant] = {}
        self._rekeys: list[tuple[float, int, str]] = []
        self._wakeups = Wakeups()
        # Running jobs bucketed by priority and by the policy's class (Tiresias queue), so a cycle
        # finds preemption victims without scanning every running job.
        self.by_priority: dict[int, dict[str, None]] = {}
        self.by_class: dict[int, dict[str, None]] = {}
        self.running_class: dict[str, int] = {}
        self.pending_priorities: dict[int, int] = {}
        self.pending_elastic = 0  # queued jobs that may start smaller than they ask
        self.pending_without_gpus = 0  # queued jobs placed by CPUs and memory alone
        self._seq = 0

    # -- tenants ----------------------------------------------------------------------------

    @property
    def quotas_active(self) -> bool:
        return any(tenant.has_quota for tenant in self.tenants.values())

    @property
    def host_quotas_active(self) -> bool:
        return any(tenant.has_host_quota for tenant in self.tenants.values())

    def over_quota(self, tenant: str, gpu_type: str, delta: int = 0) -> int:
        """GPUs of ``gpu_type`` the tenant uses beyond its quota (0 if within or unlimited)."""
        limit = self.tenant(tenant).quota_for(gpu_type)
        return max(0, self.used(tenant, gpu_type) + delta - limit)

    def tenant(self, name: str) -> Tenant:
        """A known tenant, or an unlimited default one (used when no quotas are configured)."""
        found = self.tenants.get(name)
        if found is None:  # cached: a cycle asks for every candidate's tenant
            found = self._default_tenants.get(name)
            if found is None:
                found = self._default_tenants[name] = Tenant(name)
        return found

    def used(self, tenant: str, gpu_type: str) -> int:
        return self.usage.get(tenant, {}).get(gpu_type, 0)

    # -- pending queue ----------------------------------------------------------------------

    def submit(
        self, job: Job, now: float, *, progress: Progress | None = None, seq: int | None = None
    ) -> PendingEntry:
        """Queue a job: a new one, or one coming back with the ``progress`` of its earlier runs
        (``seq``: its place among equals, when it keeps the one it had). Raises ValueError if
        the id is already known."""
        if job.id in self.pending or job.id in self.running:
            raise ValueError(f"job {job.id} is already queued or running")
        if seq is None:
            self._seq += 1
            seq = self._seq
        entry = PendingEntry(job=job, seq=seq, enqueued_at=now)
        if progress is not None:
            entry.attained_gpu_seconds = progress.attained_gpu_seconds
            entry.executed_seconds = progress.executed_seconds
            entry.last_run_seconds = progress.last_run_seconds
            entry.restarts = progress.restarts
            entry.preempted_at = progress.preempted_at
        self._enqueue(entry)
        return entry

    def _enqueue(self, entry: PendingEntry, now: float | None = None) -> None:
        """Insert into its lane; ``now`` is given when re-keying an already queued job."""
        at = entry.enqueued_at if now is None else now
        if self.policy.restarts_service(entry, at):  # (Tiresias' promotion)
            entry.attained_gpu_seconds = 0.0
        entry.key = self.policy.key(entry, at)
        entry.lane = (self.policy.group(entry), job_shape(entry.job), self.policy.lane_class(entry))
        self.pending[entry.job.id] = entry
        insort(self.lanes.setdefault(entry.lane, []), (entry.key, entry.seq, entry.job.id))
        priority = entry.job.priority
        self.pending_priorities[priority] = self.pending_priorities.get(priority, 0) + 1
        self.pending_elastic += entry.job.elastic
        self.pending_without_gpus += not entry.job.total_gpus
        if self.power is not None:
            self.power.queued(entry.job.gpu_type, entry.job.total_gpus)
        when = self.policy.rekey_at(entry) if now is None else None
        if when is not None:
            heapq.heappush(self._rekeys, (when, entry.seq, entry.job.id))

    def _dequeue(self, job_id: str) -> PendingEntry:
        entry = self.pending.pop(job_id)
        priority = entry.job.priority
        self.pending_priorities[priority] -= 1
        if not self.pending_priorities[priority]:
            del self.pending_priorities[priority]
        self.pending_elastic -= entry.job.elastic
        self.pending_without_gpus -= not entry.job.total_gpus
        if self.power is not None:
            self.power.queued(entry.job.gpu_type, -entry.job.total_gpus)
        lane = self.lanes[entry.lane]
        item = (entry.key, entry.seq, job_id)
        del lane[bisect_left(lane, item)]
        if not lane:
            del self.lanes[entry.lane]
        return entry

    def cancel_pending(self, job_id: str) -> PendingEntry:
        """Remove a waiting job from the queue (cancelled or given up)."""
        return self._dequeue(job_id)

    def refresh(self, now: float) -> None:
        """Bring time-dependent standing up to ``now``: re-key pending jobs whose order changed
        (Tiresias promotion) and re-class running jobs (Tiresias demotion). Call before a cycle."""
        while (due := self._wakeups.pop_due(now)) is not None:
            when, jobs = due
            for seq, job_id in jobs:
                running = _still(self.running, seq, job_id)
                if running is not None:
                    self._reclass(job_id, self.policy.running_class(running, now))
                    self._push_wakeup(running, job_id, after=when)
        while self._rekeys and self._rekeys[0][0] <= now:
            _, seq, job_id = heapq.heappop(self._rekeys)
            entry = _still(self.pending, seq, job_id)
            if entry is not None:
                self._dequeue(job_id)
                self._enqueue(entry, now)

    def next_wakeup(self, now: float) -> float | None:
        """The earliest time at which a job's standing changes without any event (a time not
        after ``now`` means :meth:`refresh` has work to do)."""
        times = []
        rekeys = self._rekeys
        while rekeys and _still(self.pending, rekeys[0][1], rekeys[0][2]) is None:
            heapq.heappop(rekeys)
        if rekeys:
            times.append(rekeys[0][0])
        wakeup = self._wakeups.first(self._runs)
        if wakeup is not None:
            times.append(wakeup)
        return min(times) if times else None

    def _runs(self, seq: int, job_id: str) -> bool:
        """Whether the job runs the run it was given ``seq`` for (its wakeups are not stale)."""
        return _still(self.running, seq, job_id) is not None

    def _reclass(self, job_id: str, new_class: int | None) -> None:
        old = self.running_class.pop(job_id, None)
        if old is not None:
            bucket = self.by_class[old]
            del bucket[job_id]
            if not bucket:
                del self.by_class[old]
        if new_class is not None:
            self.running_class[job_id] = new_class
            self.by_class.setdefault(new_class, {})[job_id] = None

    # -- running jobs -----------------------------------------------------------------------

    def start(
        self,
        job_id: str,
        placement: Placement,
        now: float,
        speed: float = 1.0,
        *,
        allocated: bool = False,
    ) -> RunningEntry:
        """Apply an admission: the job leaves the queue and takes its GPUs (``speed``: see
        :class:`RunningEntry`; ``allocated``: the index holds them already, a held plan's)."""
        entry = self._dequeue(job_id)
        gpu_type = ANY_GPU_TYPE
        if placement.slots:
            gpu_type = self.index.nodes[self.index.node_id[placement.slots[0].node]].gpu_type
        if not allocated:
            self.index.allocate(placement.slots)
        job = entry.job
        if placement.slots and len(placement.slots) != job.units:  # an elastic job, shrunk
            job = job.resized(job.workers_for(len(placement.slots)))
        running = RunningEntry(
            job=job,
            requested=entry.job,
            seq=entry.seq,
            placement=placement,
            gpu_type=gpu_type,
            started_at=now,
            attained_before=entry.attained_gpu_seconds,
            executed_before=entry.executed_seconds,
            last_checkpoint_at=now,
            restarts=entry.restarts,
            first_enqueued_at=entry.enqueued_at,
            speed=speed,
            preempted_at=entry.preempted_at,
        )
        self.running[job_id] = running
        tenant_usage = self.usage.setdefault(job.tenant, {})
        tenant_usage[gpu_type] = tenant_usage.get(gpu_type, 0) + job.total_gpus
        if job.needs_host:
            self._hold_host(job, 1)
        node_id, power = self.index.node_id, self.power
        # By slot, not by placement.nodes (which builds a tuple): a node met again is set alike.
        for slot in placement.slots:
            i = node_id[slot.node]
            self.node_jobs[i][job_id] = None
            if power is not None:
                power.occupied(i)
        self.by_priority.setdefault(entry.job.priority, {})[job_id] = None
        self._reclass(job_id, self.policy.running_class(running, now))
        self._push_wakeup(running, job_id, after=now)
        return running

    def _push_wakeup(self, running: RunningEntry, job_id: str, *, after: float) -> None:
        """Plan the running job's next change of standing. Only the next: a job holds one entry
        at a time, and most end before their first (a job's later entries would only wait in
        the heap to be dropped as stale). The entries pop in the same order either way."""
        when = self.policy.next_running_wakeup(running, after)
        if when is not None:
            self._wakeups.add(when, running.seq, job_id)

    def stop(
        self,
        job_id: str,
        now: float,
        *,
        requeue: bool,
        executed_seconds: float | None = None,
        preempted: bool = False,
    ) -> RunningEntry:
        """Release a running job's GPUs; requeue it (preempted, failed over) or drop it (done).

        ``executed_seconds`` is the progress kept for a requeued job (the caller knows what its
        last checkpoint preserved); by default all executed time is kept. ``preempted``: the
        job was preempted now (its cool-down counts from it).
        """
        running = self.running.pop(job_id)
        self.index.release(running.placement.slots)
        tenant_usage = self.usage[running.job.tenant]
        tenant_usage[running.gpu_type] -= running.job.total_gpus
        if running.job.needs_host:
            self._hold_host(running.job, -1)
        node_id, power = self.index.node_id, self.power
        for slot in running.placement.slots:  # (as in start: vacating a node twice is as once)
            i = node_id[slot.node]
            jobs = self.node_jobs[i]
            jobs.pop(job_id, None)
            if power is not None and not jobs:
                power.vacated(i, now)
        bucket = self.by_priority[running.job.priority]
        del bucket[job_id]
        if not bucket:
            del self.by_priority[running.job.priority]
        self._reclass(job_id, None)
        if requeue:
            executed = running.executed(now) if executed_seconds is None else executed_seconds
            progress = Progress(
                attained_gpu_seconds=running.attained(now),
                executed_seconds=executed,
                last_run_seconds=max(0.0, now - running.started_at),
                restarts=running.restarts + 1,
                preempted_at=now if preempted else running.preempted_at,
            )
            self.submit(running.requested, now, progress=progress, seq=running.seq)
        return running

    def _hold_host(self, job: Job, sign: int) -> None:
        cpus, memory = self.host_usage.get(job.tenant, (0, 0))
        self.host_usage[job.tenant] = (
            cpus + sign * job.total_millicpus,
            memory + sign * job.total_memory_mib,
        )

    def checkpointed(self, job_id: str, now: float) -> None:
        self.running[job_id].last_checkpoint_at = now

    # -- nodes ------------------------------------------------------------------------------

    def set_node_schedulable(self, node: str, schedulable: bool, now: float = 0.0) -> None:
        """A node's health (down, cordoned, back); under power saving it takes work only
        while it is also on."""
        if self.power is not None:
            i = self.index.node_id[node]
            on = self.power.health(i, schedulable, now, bool(self.node_jobs[i]))
            schedulable = schedulable and on
        self.index.set_schedulable(node, schedulable)

    def set_node_shards(self, node: str, shards: Iterable[str]) -> None:
        """The input shards (``tenant/sha256``) ``node``'s cache holds now, as it reported
        them (:mod:`.locality`); a node this state does not know is ignored."""
        index = self.index.node_id.get(node)
        if index is None:
            return
        held = frozenset(shards)
        if held:
            self.index.node_shards[index] = held
        else:
            self.index.node_shards.pop(index, None)

    def jobs_on(self, node: str) -> list[str]:
        return list(self.node_jobs[self.index.node_id[node]])

    def snapshot(self, now: float) -> Snapshot:
        return Snapshot(now=now, state=self)

    def queue_length(self) -> int:
        return len(self.pending)

    def digest(self) -> tuple[object, ...]:
        """Changes whenever the state does (tests use it to prove the scheduler is pure)."""
        usage = tuple(sorted((t, g, n) for t, d in self.usage.items() for g, n in d.items()))
        lanes = tuple(sorted((repr(k), tuple(v)) for k, v in self.lanes.items()))
        return (self.index.digest(), tuple(sorted(self.running)), usage, lanes)


_Entry = TypeVar("_Entry", PendingEntry, RunningEntry)


def _still(live: Mapping[str, _Entry], seq: int, job_id: str) -> _Entry | None:
    """The job's entry in ``live`` if it is still the one given ``seq`` (else a wakeup or a
    re-keying set for it is stale: the job has since left the queue or the run)."""
    entry = live.get(job_id)
    return entry if entry is not None and entry.seq == seq else None
