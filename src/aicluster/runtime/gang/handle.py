"""One attempt of a gang, as the control plane sees it: its status (each rank's exit record
first, else its actor), logs, telemetry, and its stop, which gives Ray its resources back.

Cheap to make from a job id and attempt alone (:meth:`aicluster.runtime.gang.launch.Runtime.gang`):
everything is read from Ray and the run directory on demand, so a restarted control plane
holds the same handle as the one that launched the gang.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.util.placement_group import get_placement_group, remove_placement_group

from aicluster.runtime.gang.status import (
    GangStatus,
    RankState,
    RankStatus,
    gang_message,
    gang_phase,
)
from aicluster.runtime.joboutput import Rejects, read_telemetry
from aicluster.runtime.layout import NAMESPACE, actor_name, gang_name
from aicluster.runtime.rundir import LogChunk, RunDir, Stream, write_json_atomic
from aicluster.train.telemetry import StepRecord

__all__ = ["GangHandle", "TelemetryCursor"]


class GangHandle:
    """One attempt of a job's gang. Cheap to create; reads Ray and the run directory on demand."""

    def __init__(self, state_dir: str, job_id: str, attempt: int) -> None:
        self.job_id, self.attempt = job_id, attempt
        self.run = RunDir(state_dir, job_id, attempt)
        spec = self.run.spec() or {}
        self.nodes: tuple[str, ...] = tuple(r["node"] for r in spec.get("ranks", []))
        self._actors: dict[int, Any] = {}  # handles looked up once (a GCS call each)

    @property
    def workers(self) -> int:
        return len(self.nodes)

    def __repr__(self) -> str:
        return f"GangHandle({self.job_id!r}, attempt={self.attempt}, workers={self.workers})"

    def _actor(self, rank: int) -> Any | None:
        if rank not in self._actors:
            name = actor_name(self.job_id, self.attempt, rank)
            try:
                self._actors[rank] = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                return None
        return self._actors[rank]

    def ended(self) -> bool:
        """Whether the attempt was stopped or one of its rank processes exited (its exit
        record is written)."""
        return self.run.stop_requested() or any(
            self.run.exit_record(rank) is not None for rank in range(self.workers)
        )

    def status(self, timeout_s: float = 10.0) -> GangStatus:
        """Each rank's state (exit record first, else its actor) and the gang's phase. Read-only."""
        ranks: dict[int, RankStatus] = {}
        polls: dict[Any, int] = {}
        for rank, node in enumerate(self.nodes):
            record = self.run.exit_record(rank)
            actor = None if record else self._actor(rank)
            if record is not None:
                ranks[rank] = self._exited(rank, node, record)
            elif actor is None:
                stopped = self.run.stop_requested()
                ranks[rank] = RankStatus(rank, node, RankState.LOST, stopped=stopped)
            else:
                polls[actor.poll.remote()] = rank
        ready, _ = ray.wait(list(polls), num_returns=len(polls), timeout=timeout_s)
        for ref in polls:
            rank = polls[ref]
            ranks[rank] = self._polled(rank, ref if ref in ready else None)
        ordered = tuple(ranks[rank] for rank in range(len(self.nodes)))
        phase = gang_phase(ordered, self.run.stop_requested())
        return GangStatus(self.job_id, self.attempt, phase, ordered, gang_message(phase, ordered))

    def _exited(self, rank: int, node: str, record: dict[str, Any]) -> RankStatus:
        code = record.get("exit_code")
        stopped = bool(record.get("stopped"))
        lost = bool(record.get("lost"))
        failed = not stopped and (lost or code != 0)
        return RankStatus(
            rank=rank,
            node=node,
            state=RankState.LOST if lost else RankState.EXITED,
            exit_code=code,
            stopped=stopped,
            finished_at=record.get("finished_at"),
            stderr_tail=self.run.tail(rank, "stderr") if failed else "",
            reason=str(record.get("reason") or ""),
        )

    def _polled(self, rank: int, ref: Any | None) -> RankStatus:
        node = self.nodes[rank]
        if ref is None:
            return RankStatus(rank, node, RankState.PENDING)
        try:
            polled = ray.get(ref)
        except ActorUnavailableError:
            return RankStatus(rank, node, RankState.PENDING)  # transient: may come back
        except (ActorDiedError, RayActorError):
            record = self.run.exit_record(rank)
            if record is not None:
                return self._exited(rank, node, record)
            return RankStatus(rank, node, RankState.LOST, stopped=self.run.stop_requested())
        if polled["state"] == "exited":
            return self._exited(rank, node, polled)
        return RankStatus(rank, node, RankState(polled["state"]))

    def wait(self, timeout_s: float | None = None, poll_s: float = 1.0) -> GangStatus:
        """Poll :meth:`status` until the phase is terminal or ``timeout_s`` passes."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.status()
            if status.phase.terminal or (deadline is not None and time.monotonic() >= deadline):
                return status
            time.sleep(poll_s)

    def stop(self, grace_s: float = 10.0) -> GangStatus:
        """End the gang and give its resources back to Ray. Idempotent.

        Running ranks get SIGTERM, then SIGKILL after ``grace_s``; then the actors are killed and
        the placement group removed. Call it too once a gang has finished (SUCCEEDED or FAILED):
        that frees its placement group and keeps its phase. Ranks that never recorded an exit are
        recorded as stopped. Returns the final status.
        """
        if not self.run.stop_requested():
            # Ranks lost before the stop stay failures, not casualties of the stop.
            for ranked in self.status().ranks:
                if ranked.state is RankState.LOST and self.run.exit_record(ranked.rank) is None:
                    record = _lost_record(ranked.rank, False)
                    write_json_atomic(self.run.exit_file(ranked.rank), record)
            write_json_atomic(self.run.stop_file, {"time": time.time(), "grace_s": grace_s})
        actors = [actor for rank in range(self.workers) if (actor := self._actor(rank))]
        ending = [actor.terminate.remote(grace_s) for actor in actors]
        ray.wait(ending, num_returns=len(ending), timeout=grace_s + 15.0)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        self._actors.clear()
        with contextlib.suppress(ValueError):  # ValueError: already removed
            remove_placement_group(get_placement_group(gang_name(self.job_id, self.attempt)))
        for rank in range(self.workers):
            if self.run.exit_record(rank) is None:
                write_json_atomic(self.run.exit_file(rank), _lost_record(rank, True))
        return self.status()

    def logs(
        self, rank: int = 0, *, stream: Stream = "stdout", offset: int = 0, max_bytes: int = 1 << 20
    ) -> LogChunk:
        """Up to ``max_bytes`` of rank ``rank``'s stdout or stderr from byte ``offset``; pass the
        returned ``offset`` back to read on. Works during and after the run."""
        return self.run.read_log(rank, stream, offset, max_bytes)

    def follow(
        self, rank: int = 0, stream: Stream = "stdout", poll_s: float = 0.5
    ) -> Iterator[str]:
        """Yield rank ``rank``'s output as it is written, until the gang ends and it is drained."""
        offset = 0
        while True:
            done = self.status().phase.terminal
            chunk = self.logs(rank, stream=stream, offset=offset)
            offset = chunk.offset
            if chunk.text:
                yield chunk.text
            elif done:
                return
            else:
                time.sleep(poll_s)

    def telemetry(self) -> dict[int, list[StepRecord]]:
        """All valid telemetry records of each rank so far (bad ones dropped)."""
        return {rank: self.run.telemetry(rank) for rank in range(self.workers)}

    def telemetry_cursor(self) -> TelemetryCursor:
        return TelemetryCursor(self.run, self.workers)


class TelemetryCursor:
    """Streams a gang's telemetry: each :meth:`poll` returns the valid records written since the
    last; :attr:`rejects` counts the dropped ones (the caller reports them)."""

    def __init__(self, run: RunDir, workers: int) -> None:
        self.run = run
        self.readers = [run.telemetry_reader(rank) for rank in range(workers)]
        self.rejects = Rejects()

    def poll(self) -> list[StepRecord]:
        new: list[StepRecord] = []
        for rank, reader in enumerate(self.readers):
            new.extend(read_telemetry(reader, rank, self.rejects))
        return new


def _lost_record(rank: int, stopped: bool) -> dict[str, Any]:
    return {
        "rank": rank,
        "exit_code": None,
        "stopped": stopped,
        "lost": True,
        "finished_at": time.time(),
    }
