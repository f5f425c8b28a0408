"""The control plane of one server process: store, leader lease, control loop and queries.

Several servers may share one PostgreSQL store: each serves the API, and only the one holding
the leader lease (:mod:`aicluster.store.leader`) runs the control loop and the serving leader.
The lease is renewed every few seconds by this module's election thread; a standby takes over
once it has seen no renewal for the lease's duration. The loop writes through a store fenced by
the epoch it won (:meth:`ControlPlane.leader_store`), so a deposed leader changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from aicluster.control.settings import ServerSettings
from aicluster.control.views.powerview import NodePower
from aicluster.control.views.preemptioncost import PreemptionTally
from aicluster.control.views.queueview import QueueEntry
from aicluster.core import Clock
from aicluster.core.preemption_cost import PreemptionCost
from aicluster.store import JobRecord, LeaseLost, Store, leader_lock
from aicluster.store.leader import LeaderLease

if TYPE_CHECKING:
    from aicluster.control.loop.loop import ControlLoop
    from aicluster.control.loop.ports import GangRuntime
    from aicluster.serve import Serving

__all__ = ["ControlPlane"]

log = logging.getLogger(__name__)
#: Seconds between a standby's looks at the lease (and a leader's checks for a due renewal).
LEASE_POLL_S = 1.0


@dataclass
class ControlPlane:
    """What the API reads and nudges. ``loop`` is None on a standby (or an API-only server)."""

    settings: ServerSettings
    store: Store
    clock: Clock
    runtime: GangRuntime | None = None
    loop_factory: Any = None  # () -> ControlLoop, called when this server becomes the leader
    loop: ControlLoop | None = None
    serving: Serving | None = None  # model serving; None without Ray
    drift: Any = None  # serve.drift.DriftMonitor of the serving gateway, when serving
    #: How sandboxed ranks are limited here (``runtime.sandbox.cgroups.support``), for /healthz.
    resource_limits: str = "none (jobs run unsandboxed)"
    _stop: threading.Event = field(default_factory=threading.Event)
    _preemptions: PreemptionTally = field(default_factory=PreemptionTally)
    _lease: LeaderLease | None = None
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        if self.store.secret_sealer is None:
            # Jobs' secrets are sealed with the state directory's key before they are stored;
            # the ranks' actors open them with the same key (docs/deploy.md).
            from aicluster.runtime.sandbox.secretbox import SecretBox

            self.store.secret_sealer = SecretBox(self.settings.state_dir).seal_spec

    # -- leadership -------------------------------------------------------------------------

    def start(self) -> None:
        """Contend for leadership in the background; run the loop while leading."""
        if self.serving is not None:
            self.serving.start()
        if self.loop_factory is None:
            return
        self._lease = leader_lock(self.store, "control", lease_s=self.settings.lease_s)
        self._thread = threading.Thread(target=self._lead, name="aicluster-leader", daemon=True)
        self._thread.start()

    def _lead(self) -> None:
        lease = self._lease
        assert lease is not None
        while not self._stop.is_set():
            try:
                if self.loop is None:
                    if lease.try_acquire():
                        log.info("this control plane is the leader (epoch %s)", lease.epoch)
                        self.loop = self.loop_factory()
                        self.loop.start()
                        if self.serving is not None:
                            self.serving.lead(self.still_leading, confirm=self.confirm_leading)
                elif not lease.renew_if_due():
                    self._step_down()
            except Exception as error:  # e.g. the database is unreachable: stand by, try again
                # A dead election thread would leave this server a standby forever.
                log.warning("leader election failed (%s); retrying", error)
            self._stop.wait(LEASE_POLL_S)

    def still_leading(self) -> bool:
        """Whether this server still holds the lease by its own clock (the loop asks at the
        start of every tick and before every Ray call). Never blocks or raises."""
        lease = self._lease
        return lease is not None and lease.still_leader()

    def confirm_leading(self) -> bool:
        """:meth:`still_leading`, and the store's lease still carries our epoch (one read):
        asked just before a side effect outside the store. Never raises."""
        lease = self._lease
        fence = lease.fence if lease is not None else None
        if fence is None or not self.still_leading():
            return False
        try:
            self.store.fenced(fence).check_fence()
        except LeaseLost:
            return False
        except Exception as error:  # cannot tell: do not act
            log.warning("cannot check the leader lease (%s)", error)
            return False
        return True

    def leader_store(self) -> Store:
        """The store the leader's control loop writes through: fenced by the epoch won, so its
        writes fail with :class:`~aicluster.store.LeaseLost` once another server took over."""
        fence = self._lease.fence if self._lease is not None else None
        if fence is None:
            raise LeaseLost("this server does not hold the leader lease")
        return self.store.fenced(fence)

    def _step_down(self) -> None:
        log.warning("lost the leader lease: stopping the control loop")
        loop, self.loop = self.loop, None
        if loop is not None:
            loop.stop()
        if self.serving is not None:
            self.serving.step_down()
        if self._lease is not None:
            self._lease.release()  # a no-op when taken over; else a standby may take it at once

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.loop is not None:
            self.loop.stop()
            with contextlib.suppress(Exception):  # best effort: the next leader sweeps them
                self.loop.give_back_disks()
            self.loop = None
        if self.serving is not None:
            self.serving.shutdown()
        if self._lease is not None:
            self._lease.release()

    def is_leader(self) -> bool:
        """Whether this server runs the control loop under a lease it still holds."""
        return self.loop is not None and self.still_leading()

    # -- what the API asks ------------------------------------------------------------------

    def wake(self) -> None:
        if self.loop is not None:
            self.loop.wake()

    def queue(self) -> list[QueueEntry]:
        return list(self.loop.queue) if self.loop is not None else []

    def queue_position(self, job_id: str) -> int | None:
        for entry in self.queue():
            if entry.job_id == job_id:
                return entry.position
        return None

    def estimated_start(self, job_id: str) -> float | None:
        """The queued job's estimated start as of the loop's latest forecast (None: none)."""
        return self.loop.estimates.by_job.get(job_id) if self.loop is not None else None

    def usage_by_tenant(self) -> dict[str, dict[str, int]]:
        return self.loop.usage_by_tenant() if self.loop is not None else {}

    def preemption_cost(self) -> dict[str, PreemptionCost]:
        """Each tenant's cost of preemption so far, read from the store (leader or standby)."""
        return self._preemptions.read(self.store, self.clock.now())

    def gpus_used_by_node(self) -> dict[str, int]:
        return self.loop.gpus_used_by_node() if self.loop is not None else {}

    def node_power(self) -> list[NodePower]:
        """Each node's draw (measured or modelled; empty on a standby)."""
        loop = self.loop
        return loop.node_power(self.settings.state_dir) if loop is not None else []

    def job_counts(self) -> dict[str, int]:
        state = self.loop.shown if self.loop is not None else None
        if state is None:
            return {}
        return {"PENDING": len(state.pending), "RUNNING": len(state.running)}

    def logs(
        self, job: JobRecord, rank: int, stream: str, offset: int, attempt: int | None
    ) -> tuple[str, int, int | None]:
        """(text, next offset, attempt) of one rank's output; empty before the job has run."""
        if self.runtime is None or job.attempt == 0:
            return "", offset, None
        from aicluster.runtime import GangError

        chosen = attempt if attempt is not None else job.attempt
        try:
            chunk = self.runtime.logs(
                job.id,
                rank,
                attempt=chosen,
                stream=_stream(stream),
                offset=offset,
            )
        except GangError:
            return "", offset, chosen
        return chunk.text, chunk.offset, chosen

    def goodput(self, job: JobRecord) -> dict[str, float]:
        from aicluster.control.views.goodput import job_goodput

        if self.runtime is None or job.attempt == 0:
            return {}
        return job_goodput(self.runtime, job.id, job.attempt).to_dict()

    def data_stats(self, job: JobRecord) -> dict[str, Any]:
        """What reading its datasets took the job's latest attempt, per rank, node and in all:
        shards served from the nodes' caches, shards and bytes fetched, seconds waited."""
        from aicluster.runtime import RunDir
        from aicluster.runtime.gang.datacache import read_data_stats

        if self.runtime is None or job.attempt == 0:
            return {"ranks": {}, "nodes": {}, "total": {}}
        return read_data_stats(RunDir(self.runtime.state_dir, job.id, job.attempt).path)

    def telemetry(self, job: JobRecord) -> dict[str, list[dict[str, Any]]]:
        if self.runtime is None or job.attempt == 0:
            return {}
        from aicluster.runtime import GangError

        try:
            ranks = self.runtime.telemetry(job.id, job.attempt)
        except GangError:
            return {}
        return {
            str(rank): [json.loads(record.to_json()) for record in records]
            for rank, records in ranks.items()
        }


def _stream(name: str) -> Literal["stdout", "stderr"]:
    return "stderr" if name == "stderr" else "stdout"
