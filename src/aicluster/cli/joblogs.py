"""What ``aicluster logs`` prints: a rank's stdout and stderr, read through the API's logs route
(``GET /v1/jobs/{id}/logs``, one stream a call, from a byte offset).

The runtime keeps no time for a line (a rank's stdout and stderr go to two files), so the two
streams cannot be put back in the order they were written. Each read prints what is new, stdout's
first, then stderr's, whole lines only (a line is held until its end arrives, so no line of one
stream is cut by the other's): a finished job's output shows all of its stdout, then all of its
stderr (a traceback last); ``-f`` interleaves them as they come, one read every half second.

With ``-f`` a job that has not started yet is waited for (said once, on stderr); when the job is
restarted, what its attempt still had is read to the end before the next attempt's output."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aicluster.cli.client import Client
from aicluster.cli.common import console, err_console
from aicluster.core import TERMINAL_STATES as TERMINAL

__all__ = ["POLL_S", "print_logs"]

#: Between two reads with ``-f``.
POLL_S = 0.5


class _Lines:
    """Prints each stream's whole lines; with one stream, everything at once."""

    def __init__(self, streams: Sequence[str]) -> None:
        self.whole = len(streams) > 1
        self.held = dict.fromkeys(streams, "")

    def add(self, stream: str, text: str) -> None:
        if not self.whole:
            console.out(text, end="", highlight=False)
            return
        text = self.held[stream] + text
        end = max(text.rfind("\n"), text.rfind("\r")) + 1
        if end:
            console.out(text[:end], end="", highlight=False)
        self.held[stream] = text[end:]

    def flush(self, stream: str | None = None) -> None:
        """Print what is held of ``stream`` (default: of each), ending its line."""
        for name, text in self.held.items():
            if text and stream in (None, name):
                console.out(text, highlight=False)
                self.held[name] = ""


class _Reader:
    def __init__(self, client: Client, job_id: str, rank: int, streams: Sequence[str]) -> None:
        self.client, self.path, self.rank = client, f"/v1/jobs/{job_id}/logs", rank
        self.streams = list(streams)
        self.offsets = dict.fromkeys(streams, 0)
        self.attempt: int | None = None  # the attempt read (None: none started yet)
        self.lines = _Lines(streams)

    def read(self, stream: str, attempt: int | None = None) -> dict[str, Any]:
        """Print what ``stream`` has from its offset on, until a read brings nothing more; the
        last answer. Without ``attempt`` it reads the job's latest attempt and stops at once
        when that is not the one read so far (its answer says which)."""
        while True:
            params: dict[str, Any] = {"rank": self.rank, "stream": stream}
            params["offset"] = self.offsets[stream]
            if attempt is not None:
                params["attempt"] = attempt
            answer: dict[str, Any] = self.client.get(self.path, **params)
            if answer["attempt"] != self.attempt or not answer["text"]:
                return answer
            self.offsets[stream] = answer["next_offset"]
            self.lines.add(stream, answer["text"])

    def round(self) -> str:
        """Read every stream once to its end; the job's state."""
        state = ""
        for stream in self.streams:
            answer = self.read(stream)
            if answer["attempt"] != self.attempt:
                self._next_attempt(answer["attempt"])
                answer = self.read(stream)
            state = answer["state"]
            if state in TERMINAL:  # its files are whole: a last line without its end is one
                self.lines.flush(stream)
        return state

    def _next_attempt(self, attempt: int | None) -> None:
        if self.attempt is not None:  # what the attempt still had, to its end
            for stream in self.streams:
                self.read(stream, self.attempt)
            self.lines.flush()
            err_console.print(f"-- attempt {attempt} --", highlight=False, soft_wrap=True)
        self.attempt = attempt
        self.offsets = dict.fromkeys(self.streams, 0)


def print_logs(
    client: Client, job_id: str, rank: int, streams: Sequence[str], follow: bool
) -> None:
    """Print rank ``rank``'s ``streams`` of the job's latest attempt; with ``follow``, on until
    the job has ended and all it wrote is printed."""
    reader = _Reader(client, job_id, rank, streams)
    told = ended = False
    while True:
        state = reader.round()
        if ended or not follow:  # a whole round read after the job ended: nothing comes later
            reader.lines.flush()
            if reader.attempt is None and state not in TERMINAL:
                err_console.print(
                    f"{job_id} is {state} and has not started: no output yet (-f waits for it)",
                    highlight=False,
                    soft_wrap=True,
                )
            return
        if state in TERMINAL:
            ended = True
            continue
        if reader.attempt is None and not told:
            err_console.print(
                f"{job_id} is {state}: waiting for it to start, then following its output "
                "(Ctrl-C to stop)",
                highlight=False,
                soft_wrap=True,
            )
            told = True
        time.sleep(POLL_S)
