"""Where a gang stands: each rank's state and exit, and the gang's phase derived from them."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from aicluster.core.failure import Failure, clean_tail, signal_name

__all__ = ["GangPhase", "GangStatus", "RankState", "RankStatus", "gang_message", "gang_phase"]


class RankState(StrEnum):
    PENDING = "pending"  # its actor is not scheduled or has not started the process yet
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"  # its actor (or node) died without recording an exit


class GangPhase(StrEnum):
    PENDING = "PENDING"  # placement group or some rank not started yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # every rank exited 0
    FAILED = "FAILED"  # some rank exited non-zero or was lost, not because of stop()
    STOPPED = "STOPPED"  # stop() ended it

    @property
    def terminal(self) -> bool:
        return self in (GangPhase.SUCCEEDED, GangPhase.FAILED, GangPhase.STOPPED)


@dataclass(frozen=True, slots=True)
class RankStatus:
    """One rank. ``exit_code`` is the process's (negative: killed by that signal).

    ``stopped`` marks an exit caused by :meth:`GangHandle.stop`; ``stderr_tail`` is the end of a
    failed rank's stderr.
    """

    rank: int
    node: str
    state: RankState
    exit_code: int | None = None
    stopped: bool = False
    finished_at: float | None = None
    stderr_tail: str = ""
    #: Why the launcher ended it, when it knows (``exceeded memory_gb=N``).
    reason: str = ""

    @property
    def last_line(self) -> str:
        """The last line of its stderr tail, printable characters only (no terminal escapes
        reach a CLI), at most 500."""
        line = self.stderr_tail.strip().splitlines()[-1:] or [""]
        return "".join(ch for ch in line[0] if ch.isprintable())[:500]

    @property
    def failed(self) -> bool:
        if self.stopped:
            return False
        return self.state is RankState.LOST or (
            self.state is RankState.EXITED and self.exit_code != 0
        )

    def describe(self) -> str:
        if self.state is RankState.LOST:
            return f"rank {self.rank} on {self.node} was lost (its actor or node died)"
        if self.state is not RankState.EXITED:
            return f"rank {self.rank} on {self.node} is {self.state.value}"
        if self.reason:
            return f"rank {self.rank} on {self.node} {self.reason}"
        code = self.exit_code
        how = f"exited with code {code}"
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        return f"rank {self.rank} on {self.node} {how}"


@dataclass(frozen=True, slots=True)
class GangStatus:
    """A gang's phase, its ranks, and a message saying why (the first failure, if any)."""

    job_id: str
    attempt: int
    phase: GangPhase
    ranks: tuple[RankStatus, ...]
    message: str = ""

    @property
    def failed_ranks(self) -> tuple[RankStatus, ...]:
        """Failed ranks, the first to fail first (later ones often fail because of it)."""
        return first_to_fail_first(self.ranks)

    @property
    def exit_codes(self) -> dict[int, int | None]:
        return {rank.rank: rank.exit_code for rank in self.ranks}

    @property
    def failure(self) -> Failure | None:
        """The first rank to fail, its exit and its stderr's last lines (None: none failed)."""
        first = next(iter(self.failed_ranks), None)
        if first is None:
            return None
        return Failure(
            rank=first.rank,
            node=first.node,
            summary=first.describe(),
            exit_code=first.exit_code,
            signal=signal_name(first.exit_code) if first.state is RankState.EXITED else None,
            lost=first.state is RankState.LOST,
            attempt=self.attempt,
            stderr_tail=clean_tail(first.stderr_tail),
        )


def gang_phase(ranks: Sequence[RankStatus], stop_requested: bool) -> GangPhase:
    """The phase of a gang whose ranks are ``ranks``.

    A failure wins over everything (its other ranks are doomed: collectives with a dead peer hang or
    fail). Success needs every rank to exit 0 on its own; a stop is STOPPED once no rank runs any
    more, also when the ranks honoured the stop by checkpointing and exiting 0 (``stopped``).
    """
    if any(rank.failed for rank in ranks):
        return GangPhase.FAILED
    finished = all(r.state is RankState.EXITED and r.exit_code == 0 for r in ranks)
    if ranks and finished and not any(rank.stopped for rank in ranks):
        return GangPhase.SUCCEEDED
    live = any(rank.state in (RankState.RUNNING, RankState.PENDING) for rank in ranks)
    if stop_requested and not live:
        return GangPhase.STOPPED
    if any(rank.state is RankState.PENDING for rank in ranks):
        return GangPhase.PENDING
    return GangPhase.RUNNING


def first_to_fail_first(ranks: Sequence[RankStatus]) -> tuple[RankStatus, ...]:
    """The failed ranks of ``ranks``, the first to fail first (ranks still running last)."""
    failed = [rank for rank in ranks if rank.failed]
    return tuple(sorted(failed, key=lambda r: (r.finished_at is None, r.finished_at or 0.0)))


def gang_message(phase: GangPhase, ranks: Sequence[RankStatus]) -> str:
    """What a gang's status says: its first failure (with the last line of that rank's
    stderr), its success, its stop, or whom it waits for."""
    if phase is GangPhase.FAILED:
        first = first_to_fail_first(ranks)[0]
        return f"{first.describe()}: {first.last_line}".rstrip(": ")
    if phase is GangPhase.SUCCEEDED:
        return f"all {len(ranks)} ranks exited 0"
    if phase is GangPhase.STOPPED:
        return "stopped"
    waiting = [rank.rank for rank in ranks if rank.state is RankState.PENDING]
    return f"waiting for ranks {waiting}" if waiting else f"{len(ranks)} ranks running"
