"""Power saving: which nodes to power down and which to bring back, one pure state machine that
the simulator and the live control loop both drive (through :mod:`.effects`).

A node idle (no job on it) for ``suspend_after`` seconds is suspended, unless the floors of nodes
kept on forbid it or jobs of its GPU type are waiting for GPUs (which covers a backfill
reservation: one is made only for a waiting job). A node holding work is never idle. A
suspending or off node takes no work: the scheduler places only on nodes that are on, so it
prefers them by construction. When the queue asks for more GPUs of a type than the nodes that
are on have free (and those already resuming bring), off nodes of that type are resumed, the
off longest first. Timed ends (a suspend or a resume done) happen at :meth:`PowerManager.next_due`;
the loop calls :meth:`PowerManager.step` then and after each cycle.

The simulator's suspends and resumes take exactly their configured time (``timed``). The live
loop's end when its provider and Ray say so (``timed=False``, :mod:`aicluster.control.loop.power`):
it calls :meth:`PowerManager.finish` then, or :meth:`PowerManager.resume_failed`; the configured
times are then only what a waiting job is told to expect.

Costs: the state hooks below run only when a ``power:`` policy is set (``SchedulerState.power``
is None otherwise); a step visits the nodes that change, the idle nodes past their deadline and
the off nodes it resumes, never the whole cluster.
"""

from __future__ import annotations

from aicluster.core import ANY_GPU_TYPE
from aicluster.core.power import PowerPolicy, PowerState, Transition
from aicluster.scheduler.index import FreeIndex

__all__ = ["PowerManager"]


class PowerManager:
    """Each node's power state, its idle clock, and the GPUs the queue waits for per type."""

    def __init__(
        self, index: FreeIndex, policy: PowerPolicy, now: float = 0.0, *, timed: bool = True
    ) -> None:
        self.index, self.policy, self.timed = index, policy, timed
        count = len(index.nodes)
        self.states = [PowerState.ON] * count
        #: On nodes with no job, by the time they became idle (insertion order is time order).
        self.idle_since: dict[int, float] = dict.fromkeys(range(count), now)
        self.ends: dict[int, float] = {}  # suspending or resuming node -> when it is done
        self.off: dict[int, None] = {}  # off nodes, in index order when first powered down
        self.unhealthy: set[int] = set()  # down or cordoned: never resumed, never suspended
        #: Nodes never powered down (as Slurm's SuspendExcNodes: a head node, a login node).
        self.pinned: set[int] = set()
        self.waiting_gpus: dict[str, int] = {}  # GPUs of queued jobs, per requested type
        self.on_count = count  # on, idle or resuming: what the floors count
        self.rack_on: dict[int, int] = {}
        for i in range(count):
            rack = index.node_rack[i]
            self.rack_on[rack] = self.rack_on.get(rack, 0) + 1

    # -- hooks from the state ----------------------------------------------------------------

    def occupied(self, i: int) -> None:
        self.idle_since.pop(i, None)

    def vacated(self, i: int, now: float) -> None:
        if self.states[i] is PowerState.ON and i not in self.unhealthy:
            self.idle_since[i] = now

    def queued(self, gpu_type: str, gpus: int) -> None:
        """``gpus`` more (negative: fewer) GPUs of ``gpu_type`` wait in the queue."""
        self.waiting_gpus[gpu_type] = self.waiting_gpus.get(gpu_type, 0) + gpus

    def health(self, i: int, healthy: bool, now: float, busy: bool) -> bool:
        """A node went down or came back; returns whether it may take work (it is on)."""
        if healthy:
            if i in self.unhealthy and not busy:
                self.unhealthy.discard(i)
                self.vacated(i, now)
            self.unhealthy.discard(i)
        else:
            self.unhealthy.add(i)
            self.idle_since.pop(i, None)
        return self.states[i] is PowerState.ON

    # -- the state machine -------------------------------------------------------------------

    def state_of(self, i: int) -> PowerState:
        state = self.states[i]
        return PowerState.IDLE if state is PowerState.ON and i in self.idle_since else state

    def step(self, now: float) -> list[Transition]:
        """Finish the suspends and resumes due by ``now``, resume what the queue needs, and
        suspend the nodes idle long enough; returns the transitions, in order."""
        changes = self._finish(now)
        changes += self._resume_for_queue(now)
        changes += self._suspend_idle(now)
        return changes

    def resume_failed(self, i: int, now: float) -> Transition:
        """A resume (or, live, a suspend) did not complete: the node stays out of placement
        until it is seen up again (:meth:`recovered`); the queue's demand then resumes another
        at the next step."""
        self.ends.pop(i, None)
        self.idle_since.pop(i, None)
        self.off.pop(i, None)
        if self.states[i] is PowerState.RESUMING:
            self._count_on(i, -1)
        self.index.set_schedulable(self.index.nodes[i].name, False)
        return self._set(i, PowerState.FAILED, now)

    def finish(self, i: int, now: float) -> Transition:
        """Node ``i``'s suspend or resume is done now (live: its provider and Ray said so)."""
        del self.ends[i]
        return self._end(i, now)

    def recovered(self, i: int, now: float) -> Transition:
        """A node that failed to resume is up after all (an operator mended it): on and idle."""
        self._count_on(i, 1)
        change = self._set(i, PowerState.ON, now)
        self._back_on(i, now)
        return change

    def follow(self, other: PowerManager) -> None:
        """Take ``other``'s node states, idle clocks and timings (a forecast from the live state,
        of the same nodes, before any job is added): off nodes stay off until the queue resumes
        them, and nodes suspending or resuming end when ``other`` expects them to."""
        self.states = list(other.states)
        self.idle_since = dict(other.idle_since)
        self.ends = dict(other.ends)
        self.off = dict(other.off)
        self.unhealthy = set(other.unhealthy)
        self.pinned = set(other.pinned)
        self.on_count, self.rack_on = other.on_count, dict(other.rack_on)
        for i, node in enumerate(self.index.nodes):
            self.index.set_powered(i, other.index.powered_on[i])
            usable = self.states[i] is PowerState.ON and i not in self.unhealthy
            self.index.set_schedulable(node.name, usable)

    def restore(self, i: int, state: PowerState, until: float | None, now: float) -> None:
        """Node ``i`` is in ``state`` (a suspend or resume expected done at ``until``): as
        recorded before this manager was made (the live loop rebuilds its state from the store)."""
        if state in (PowerState.ON, PowerState.IDLE):
            return
        self.idle_since.pop(i, None)
        self.states[i] = state
        self.index.set_schedulable(self.index.nodes[i].name, False)
        if state is not PowerState.RESUMING:
            self._count_on(i, -1)
        if state in (PowerState.SUSPENDING, PowerState.RESUMING):
            self.ends[i] = now if until is None else until
        if state in (PowerState.OFF, PowerState.SUSPENDING):
            self.index.set_powered(i, state is PowerState.SUSPENDING)
        if state is PowerState.OFF:
            self.off[i] = None

    def next_due(self, now: float) -> float | None:
        """The earliest time a step would change something without any other event."""
        due = min(self.ends.values(), default=None)
        after = self.policy.suspend_after
        for i, since in self.idle_since.items():
            deadline = since + after
            if deadline > now and not self._held_on(i):
                due = deadline if due is None else min(due, deadline)
                break
        return due

    def resuming_for(self, gpu_type: str) -> tuple[int, float] | None:
        """The nodes resuming that can serve ``gpu_type`` and when the last is up (for a
        waiting job's reason)."""
        ends = [
            end
            for i, end in self.ends.items()
            if self.states[i] is PowerState.RESUMING
            and gpu_type in (ANY_GPU_TYPE, self.index.nodes[i].gpu_type)
        ]
        return (len(ends), max(ends)) if ends else None

    def _finish(self, now: float) -> list[Transition]:
        if not self.timed:  # live: each ends when the provider and Ray confirm it (finish)
            return []
        done = sorted((end, i) for i, end in self.ends.items() if end <= now)
        changes = []
        for end, i in done:
            del self.ends[i]
            changes.append(self._end(i, end))
        return changes

    def _end(self, i: int, at: float) -> Transition:
        if self.states[i] is PowerState.SUSPENDING:
            self.index.set_powered(i, False)
            self.off[i] = None
            return self._set(i, PowerState.OFF, at)
        change = self._set(i, PowerState.ON, at)
        self._back_on(i, at)
        return change

    def _back_on(self, i: int, at: float) -> None:
        self.index.set_powered(i, True)
        if i not in self.unhealthy:
            self.index.set_schedulable(self.index.nodes[i].name, True)
            self.idle_since[i] = at

    def _resume_for_queue(self, now: float) -> list[Transition]:
        changes: list[Transition] = []
        for gpu_type, waiting in self.waiting_gpus.items():
            if waiting <= 0 or not self.off:
                continue
            short = waiting - self._free_soon(gpu_type)
            for i in list(self.off):
                if short <= 0:
                    break
                node = self.index.nodes[i]
                if i in self.unhealthy or gpu_type not in (ANY_GPU_TYPE, node.gpu_type):
                    continue
                del self.off[i]
                self.index.set_powered(i, True)
                self.ends[i] = now + self.policy.resume_time
                self._count_on(i, 1)
                changes.append(self._set(i, PowerState.RESUMING, now, self.ends[i]))
                short -= node.gpus
        return changes

    def _free_soon(self, gpu_type: str) -> int:
        """Free GPUs of a type on nodes that are on, plus those of nodes resuming."""
        index = self.index
        if gpu_type == ANY_GPU_TYPE:
            free = sum(index.free_by_type.values())
        else:
            free = index.free_by_type.get(gpu_type, 0)
        for i in self.ends:
            node = index.nodes[i]
            if self.states[i] is PowerState.RESUMING and gpu_type in (ANY_GPU_TYPE, node.gpu_type):
                free += node.gpus
        return free

    def _suspend_idle(self, now: float) -> list[Transition]:
        changes: list[Transition] = []
        after = self.policy.suspend_after
        for i, since in list(self.idle_since.items()):
            if since + after > now:
                break
            if self._held_on(i):
                continue
            end = self.ends[i] = now + self.policy.suspend_time
            changes.append(self._set(i, PowerState.SUSPENDING, now, end))  # (before: idle)
            del self.idle_since[i]
            self.index.set_schedulable(self.index.nodes[i].name, False)
            self._count_on(i, -1)
        return changes

    def _held_on(self, i: int) -> bool:
        """Whether a floor, or jobs waiting for its GPU type, keeps idle node ``i`` on. (A
        backfill reservation is made only for a waiting job, so this keeps its nodes on too.)"""
        policy = self.policy
        if i in self.pinned or self.on_count <= policy.min_nodes_on:
            return True
        if self.rack_on[self.index.node_rack[i]] <= policy.min_nodes_on_per_rack:
            return True
        waiting = self.waiting_gpus
        return waiting.get(self.index.nodes[i].gpu_type, 0) > 0 or waiting.get(ANY_GPU_TYPE, 0) > 0

    def _count_on(self, i: int, delta: int) -> None:
        self.on_count += delta
        self.rack_on[self.index.node_rack[i]] += delta

    def _set(self, i: int, after: PowerState, at: float, done: float | None = None) -> Transition:
        before = self.state_of(i)
        self.states[i] = after
        return Transition(self.index.nodes[i].name, before, after, at, done)
