"""Which failed attempts run again: the restart rule, written once.

A failure is the infrastructure's (its node lost, the launcher unable to start a rank, a hang, a
gang that vanished; a preemption is requeued, never counted here) or the job's own (a rank of
its code exited non-zero or was killed for its own limits). ``max_restarts`` counts both. With
the spec's ``restart_on: infrastructure`` (the default) a job's own failure restarts too, but
not one identical to the attempt's before (the same exit code and the same last line of
stderr): that error will not mend itself, and the job ends FAILED with it. ``restart_on: any``
restarts every failure up to ``max_restarts``.

A restarted job waits :func:`backoff_s` before it queues again: exponentially longer while its
attempts crash before their first step (a crash loop), not at all after one that trained.

The live loop applies both (``aicluster.control.loop.lifecycle``). The simulator's only failures
are lost nodes, the infrastructure's, which it always requeues (it has no ``max_restarts``), so
it has nothing to ask this rule.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FailedAttempt", "backoff_s", "refusal"]


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """How one attempt failed."""

    infrastructure: bool
    exit_code: int | None = None
    error: str = ""  # the last line of the failing rank's stderr

    def repeats(self, previous: FailedAttempt | None) -> bool:
        """The job's own failure, identical to ``previous`` (the attempt before's)."""
        return (
            previous is not None
            and not self.infrastructure
            and not previous.infrastructure
            and (self.exit_code, self.error) == (previous.exit_code, previous.error)
        )


def refusal(
    failure: FailedAttempt,
    previous: FailedAttempt | None,
    restarts: int,
    max_restarts: int,
    restart_on: str = "infrastructure",
) -> str | None:
    """Why the attempt that failed with ``failure`` is not restarted (None: it is), after
    ``restarts`` restarts; ``previous``: how the attempt before failed (None: it did not)."""
    if restart_on == "infrastructure" and failure.repeats(previous):
        return (
            f"the same failure twice in a row, after {_restarts(restarts)}; restart_on: any "
            "restarts it up to max_restarts"
        )
    if restarts >= max_restarts:
        return f"after {_restarts(restarts)}"
    return None


def backoff_s(streak: int, base_s: float, cap_s: float) -> float:
    """How long a restarted job waits before it queues again, after ``streak`` attempts in a row
    that failed before their first step (0: the last one trained, so it restarts at once):
    ``base_s`` doubled for each crash after the first, at most ``cap_s``."""
    return 0.0 if streak <= 0 else min(cap_s, base_s * 2 ** (streak - 1))


def _restarts(count: int) -> str:
    return f"{count} restart" if count == 1 else f"{count} restarts"
