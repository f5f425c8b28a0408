"""How a failed attempt ended, as a user reads it: the rank that failed first and its node, its
exit code or the signal that killed it, and the last lines of its stderr (a traceback's end).

The runtime builds a :class:`Failure` from the first rank to fail; the control loop stores it with
the job's RESTARTING or FAILED transition (the job's ``failure``, the event's details); the API,
the CLI (``jobs``, ``why``) and the dashboard show it. A job's stderr is untrusted text:
:func:`clean_tail` keeps printable characters only, at most :data:`TAIL_LINES` lines of at most
:data:`LINE_CHARS` characters each, so no terminal escape reaches a CLI and the record is bounded.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

__all__ = ["LINE_CHARS", "TAIL_LINES", "Failure", "clean_tail", "printable", "signal_name"]

#: Lines of a failed rank's stderr kept with the job (a traceback's end).
TAIL_LINES = 10
#: Characters kept of each line (a longer one ends with "…").
LINE_CHARS = 240


def signal_name(exit_code: int | None) -> str | None:
    """The signal that killed a process whose exit code is ``exit_code`` (negative: killed by that
    signal, as Python's subprocess reports it): ``SIGKILL`` for -9; None for a plain exit."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


def printable(text: str, limit: int = LINE_CHARS) -> str:
    """``text`` on one line of printable characters (tabs as spaces, the rest of the control
    and format characters dropped), at most ``limit`` characters (cut with "…")."""
    line = "".join(ch for ch in text if ch.isprintable() or ch == "\t").expandtabs(4)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def clean_tail(text: str, lines: int = TAIL_LINES, width: int = LINE_CHARS) -> tuple[str, ...]:
    """The last ``lines`` non-blank-ended lines of ``text``, each :func:`printable`."""
    kept = [printable(line.rstrip(), width) for line in text.splitlines()]
    while kept and not kept[-1].strip():
        kept.pop()
    kept = kept[-lines:] if lines > 0 else []
    while kept and not kept[0].strip():
        kept.pop(0)
    return tuple(kept)


@dataclass(frozen=True, slots=True)
class Failure:
    """The first rank to fail in an attempt.

    ``summary`` says it in a sentence ("rank 1 on node-a exited with code 1", "... was killed by
    SIGKILL", "... was lost (its actor or node died)", or the launcher's reason). ``signal`` is the
    name of the signal that killed it (its ``exit_code`` is then negative); ``lost`` marks a rank
    whose actor or node died without an exit. ``stderr_tail`` is :func:`clean_tail` of its stderr.
    """

    rank: int
    node: str
    summary: str
    exit_code: int | None = None
    signal: str | None = None
    lost: bool = False
    attempt: int | None = None
    stderr_tail: tuple[str, ...] = ()

    @property
    def last_line(self) -> str:
        """The last line of its stderr ("" when it wrote none): a traceback's exception."""
        return self.stderr_tail[-1].strip() if self.stderr_tail else ""

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "summary": self.summary,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "lost": self.lost,
            "attempt": self.attempt,
            "stderr_tail": list(self.stderr_tail),
        }
