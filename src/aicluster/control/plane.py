"""The control plane of one server process: store, leader lease, control loop and queries.

Several servers may share one PostgreSQL store: each serves the API, and only the one holding
the leader lease runs the control loop; a standby takes over when the leader's lease drops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from aicluster.api.settings import ServerSettings
from aicluster.control.queueview import QueueEntry
from aicluster.core import Clock
from aicluster.scheduler import SchedulerConfig
from aicluster.store import JobRecord, Store, leader_lock

if TYPE_CHECKING:
    from aicluster.control.loop import ControlLoop
    from aicluster.runtime import Runtime
    from aicluster.serve import Serving

__all__ = ["ControlPlane"]

log = logging.getLogger(__name__)
#: Seconds between a standby's tries for the lease (and a leader's checks between ticks).
LEASE_POLL_S = 1.0


@dataclass
class ControlPlane:
    """What the API reads and nudges. ``loop`` is None on a standby (or an API-only server)."""

    settings: ServerSettings
    store: Store
    clock: Clock
    runtime: Runtime | None = None
    loop_factory: Any = None  # () -> ControlLoop, called when this server becomes the leader
    loop: ControlLoop | None = None
    serving: Serving | None = None  # model serving; None without Ray
    drift: Any = None  # serve.drift.DriftMonitor of the serving gateway, when serving
    #: How sandboxed ranks are limited on this host (``runtime.cgroups.support``), for /healthz.
    resource_limits: str = "none (jobs run unsandboxed)"
    _stop: threading.Event = field(default_factory=threading.Event)
    _lease: Any = None
    _thread: threading.Thread | None = None
    _lease_lock: threading.Lock = field(default_factory=threading.Lock)

    # -- leadership -------------------------------------------------------------------------

    def start(self) -> None:
        """Contend for leadership in the background; run the loop while leading."""
        if self.serving is not None:
            self.serving.start()
        if self.loop_factory is None:
            return
        self._lease = leader_lock(self.store, "control")
        self._thread = threading.Thread(target=self._lead, name="aicluster-leader", daemon=True)
        self._thread.start()

    def _lead(self) -> None:
        while not self._stop.is_set():
            try:
                if self.loop is None:
                    with self._lease_lock:
                        won = self._lease.try_acquire()
                    if won:
                        log.info("this control plane is the leader")
                        self.loop = self.loop_factory()
                        self.loop.start()
                        if self.serving is not None:
                            self.serving.lead(self.still_leading)
                elif not self.still_leading():
                    self._step_down()
            except Exception as error:  # e.g. the database is unreachable: stand by, try again
                # A dead election thread would leave this server a standby forever.
                log.warning("leader election failed (%s); retrying", error)
            self._stop.wait(LEASE_POLL_S)

    def still_leading(self) -> bool:
        """Whether this server still holds the lease (the loop asks at the start of every tick,
        so a deposed leader stops acting within a tick, not a poll period). Never raises: a
        lease that cannot be checked is given up."""
        with self._lease_lock:
            lease = self._lease
            if lease is None or not lease.held:
                return False
            try:
                return bool(lease.still_leader())
            except Exception as error:
                log.warning("cannot check the leader lease (%s): giving it up", error)
                with contextlib.suppress(Exception):
                    lease.release()
                return False

    def _step_down(self) -> None:
        log.warning("lost the leader lease: stopping the control loop")
        loop, self.loop = self.loop, None
        if loop is not None:
            loop.stop()
        if self.serving is not None:
            self.serving.step_down()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.loop is not None:
            self.loop.stop()
            self.loop = None
        if self.serving is not None:
            self.serving.shutdown()
        if self._lease is not None:
            with self._lease_lock:
                self._lease.release()

    def is_leader(self) -> bool:
        return self.loop is not None

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

    def usage_by_tenant(self) -> dict[str, dict[str, int]]:
        return self.loop.usage_by_tenant() if self.loop is not None else {}

    def gpus_used_by_node(self) -> dict[str, int]:
        return self.loop.gpus_used_by_node() if self.loop is not None else {}

    def job_counts(self) -> dict[str, int]:
        state = self.loop.state if self.loop is not None else None
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
        from aicluster.control.goodput import job_goodput

        if self.runtime is None or job.attempt == 0:
            return {}
        return job_goodput(self.runtime, job.id, job.attempt).to_dict()

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


def default_config() -> SchedulerConfig:
    return SchedulerConfig(queue="fair", backfill="easy", preemption=True)
