"""Power saving on the live cluster: the scheduler's power state machine
(:mod:`aicluster.scheduler.power`, the one the simulator steps) carried out through a node
provider (:mod:`aicluster.runtime.cluster.providers`), checked against what Ray reports, and
recorded in the store.

Each tick, after the cycle, :meth:`LivePower.step`:

1. ends the suspends and resumes that are done. A suspend is done when its provider call
   returned (or, after a restart, when Ray no longer sees the node); a resume when its provider
   call returned *and* Ray reports the node alive. A provider error, or a resume not done within
   ``resume_timeout_s``, leaves the node ``failed-to-resume``: out of placement, so the queue's
   demand resumes another node at once and the waiting job goes there. A failed node that Ray
   reports alive again (an operator mended it) is taken back.
2. steps the state machine: the suspends of nodes idle for ``suspend_after`` and the resumes the
   queue needs start, each provider call on a worker thread (a tick never waits for one).
3. records every transition on the node's row (``power``, ``power_until``) and as a
   ``node.power`` event, so ``aicluster nodes`` and ``aicluster audit --action node.power`` show
   them, and a rebuilt state (a new configuration, a new leader) starts from them.

Ray's health of a node under power saving (suspending, off, resuming, failed) is this module's,
not the loop's: a suspended node being gone from Ray is not a failure.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from aicluster.core.power import PowerPolicy, PowerState, Transition
from aicluster.runtime.cluster.providers import NodeProvider
from aicluster.scheduler import SchedulerState
from aicluster.scheduler.power import PowerManager
from aicluster.store import NodeRecord, Store

__all__ = ["MANAGED", "LivePower"]

log = logging.getLogger(__name__)
ACTOR = "control"

#: Stored power states in which Ray's view of a node is power saving's to judge.
MANAGED = frozenset({PowerState.SUSPENDING, PowerState.OFF, PowerState.RESUMING, PowerState.FAILED})


@dataclass
class _Call:
    """A provider call under way or done, for one node."""

    operation: str  # "suspend" or "resume"
    started_at: float
    future: Future[None]


class LivePower:
    """Carries out power saving's transitions on the live cluster (see the module's docs)."""

    def __init__(self, store: Store, provider: NodeProvider | None) -> None:
        self.store, self.provider = store, provider
        self._calls: dict[str, _Call] = {}
        self._errors: dict[str, str] = {}  # why a node failed, for its event
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="aicluster-power")
        self._warned = False

    def adopt(self, state: SchedulerState, records: list[NodeRecord], now: float) -> None:
        """A fresh state (built from the store): its nodes' power states as recorded. Without
        a power policy (turned off while nodes were off) the nodes that are not on still come
        back through the same machine, when the queue needs them, and none is powered down."""
        power = state.power
        if power is None:
            if all(record.power == PowerState.ON.value for record in records):
                return
            log.warning("power saving is off but some nodes are not on: resumed when needed")
            power = state.power = PowerManager(state.index, PowerPolicy(suspend_after=math.inf))
        power.timed = False  # live: suspends and resumes end when confirmed (step)
        power.idle_since = dict.fromkeys(power.idle_since, now)  # idle, as far as we know, now
        kept_on = self.provider.never_suspend if self.provider is not None else frozenset()
        power.pinned = {i for name, i in state.index.node_id.items() if name in kept_on}
        for record in records:
            i = state.index.node_id.get(record.node.name)
            if i is not None and record.power != PowerState.ON.value:
                power.restore(i, PowerState(record.power), record.power_until, now)

    def step(self, state: SchedulerState, alive: Mapping[str, bool] | None, now: float) -> None:
        """End what is done, start what the state machine asks for, record each transition.
        ``alive``: Ray's health by node name (None without Ray: the provider's word is enough)."""
        power = state.power
        if power is None:
            return
        if self.provider is None:
            if not self._warned:
                log.warning("power saving is configured but no node provider: every node stays on")
                self._warned = True
            return
        changes = self._confirm(power, alive, now)
        started = power.step(now)
        for change in started:
            self._start(change, now)
        for change in changes + started:
            self._record(change, power.policy)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- ending suspends and resumes -------------------------------------------------------

    def _confirm(
        self, power: PowerManager, alive: Mapping[str, bool] | None, now: float
    ) -> list[Transition]:
        changes: list[Transition] = []
        node_id = power.index.node_id
        for name, i in node_id.items():
            state = power.states[i]
            if state is PowerState.SUSPENDING:
                changes += self._suspend_done(power, i, name, alive, now)
            elif state is PowerState.RESUMING:
                changes += self._resume_done(power, i, name, alive, now)
            elif state is PowerState.FAILED and alive is not None and alive.get(name):
                # mended by an operator, or a resume that came back after its timeout
                log.info("node %s failed to resume earlier and is up now: taken back", name)
                changes.append(power.recovered(i, now))
        return changes

    def _suspend_done(
        self, power: PowerManager, i: int, name: str, alive: Mapping[str, bool] | None, now: float
    ) -> list[Transition]:
        call = self._calls.get(name)
        if call is None:  # started by an earlier leader: done once Ray no longer sees it
            if alive is not None and not alive.get(name, False):
                return [power.finish(i, now)]
            return []
        if not call.future.done():
            return []
        del self._calls[name]
        error = call.future.exception()
        if error is not None:
            return [self._failed(power, i, name, f"did not power down: {error}", now)]
        return [power.finish(i, now)]

    def _resume_done(
        self, power: PowerManager, i: int, name: str, alive: Mapping[str, bool] | None, now: float
    ) -> list[Transition]:
        call = self._calls.get(name)
        if call is not None and call.future.done():
            error = call.future.exception()
            if error is not None:
                del self._calls[name]
                return [self._failed(power, i, name, f"did not come back: {error}", now)]
        answered = call is None or call.future.done()
        up = alive is None or alive.get(name, False)
        if answered and up:
            self._calls.pop(name, None)
            return [power.finish(i, now)]
        started = call.started_at if call is not None else power.ends[i] - power.policy.resume_time
        timeout = power.policy.resume_timeout or 2 * power.policy.resume_time
        if now - started > timeout:
            self._calls.pop(name, None)
            why = f"not alive in Ray {timeout:.0f} s after its resume began"
            return [self._failed(power, i, name, why, now)]
        return []

    def _failed(self, power: PowerManager, i: int, name: str, why: str, now: float) -> Transition:
        log.error("node %s %s", name, why)
        self._errors[name] = why
        return power.resume_failed(i, now)

    # -- starting them ---------------------------------------------------------------------

    def _start(self, change: Transition, now: float) -> None:
        provider = self.provider
        assert provider is not None
        name, operation = change.node, change.after
        if operation is PowerState.SUSPENDING:
            call = provider.suspend
        elif operation is PowerState.RESUMING:
            call = provider.resume
        else:
            return
        timeout = max(60.0, 2 * ((change.done_at or now) - now))
        future = self._pool.submit(call, name, timeout)
        self._calls[name] = _Call(operation.value, now, future)

    def _record(self, change: Transition, policy: PowerPolicy) -> None:
        after = PowerState.ON if change.after is PowerState.IDLE else change.after
        reason = self._errors.pop(change.node, None) or _REASONS[after].format(policy=policy)
        until = change.done_at
        self.store.set_node_power(change.node, after.value, ACTOR, until=until, reason=reason)


_REASONS = {
    PowerState.SUSPENDING: "idle for {policy.suspend_after:.0f} s",
    PowerState.OFF: "powered down",
    PowerState.RESUMING: "queued jobs need its GPUs",
    PowerState.ON: "up: Ray reports it alive",
    PowerState.FAILED: "failed",
}
