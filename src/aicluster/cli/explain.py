"""What ``aicluster why`` prints, and the short failure note of ``aicluster jobs``.

Every line is wrapped at spaces to the terminal's width under its own indentation (no line
goes back to column 0, no path is broken: :func:`~aicluster.cli.output.print_wrapped`). A
FAILED job shows its failure (``GET /v1/jobs/{id}/why``'s ``failure``): the first rank to
fail and its node, its exit code or signal, and the last lines of its stderr."""

from __future__ import annotations

from typing import Any

from rich.filesize import decimal

from aicluster.cli.common import console, estimated
from aicluster.cli.output import print_wrapped

__all__ = ["NOTE_CHARS", "failure_note", "print_why"]

#: The longest failure note ``aicluster jobs`` shows (``why`` shows all of it).
NOTE_CHARS = 48


def failure_note(failure: dict[str, Any]) -> str:
    """A failure in a few words: its exit code or signal, then its stderr's last line (else its
    summary), cut at :data:`NOTE_CHARS` with "…": ``exit 1: ValueError: loss is nan``."""
    tail = failure.get("stderr_tail") or []
    said = str(tail[-1]).strip() if tail else str(failure.get("summary") or "")
    note = f"{_how(failure)}: {said}" if said else _how(failure)
    return note if len(note) <= NOTE_CHARS else note[: NOTE_CHARS - 1] + "…"


def _how(failure: dict[str, Any]) -> str:
    if failure.get("lost"):
        return "lost"
    if failure.get("signal"):
        return str(failure["signal"])
    code = failure.get("exit_code")
    return f"exit {code}" if code is not None else "failed"


def _exit(failure: dict[str, Any]) -> str:
    if failure.get("lost"):
        return "no exit: its actor or node died"
    if failure.get("signal"):
        return f"killed by {failure['signal']} (exit code {failure.get('exit_code')})"
    return f"exit code {failure.get('exit_code')}"


def print_why(answer: dict[str, Any]) -> None:
    """``why``'s answer, for people."""
    position = f", position {answer['position']} in the queue" if answer["position"] else ""
    console.print(f"[bold]{answer['job_id']}[/] is {answer['state']}{position}")
    print_wrapped(answer["reason"], 2)
    failure = answer.get("failure")
    if failure:
        _print_failure(answer["job_id"], failure)
    if answer["state"] == "PENDING":
        start = answer.get("estimated_start")
        told = (
            estimated(start) if start is not None else "unknown (none yet, or beyond the forecast)"
        )
        print_wrapped(f"estimated start: {told}", 2)
    if answer.get("straggler"):
        print_wrapped(answer["straggler"], 2)
    data = answer.get("data")
    if data:
        print_wrapped(
            f"data: {data['cache_hits']} shards from the nodes' caches, "
            f"{data['shards_fetched']} fetched ({decimal(data['bytes_fetched'])}), "
            f"ranks waited {data['wait_seconds']:.1f}s in all",
            2,
        )
    placement = answer.get("placement")
    if answer["state"] == "FAILED" or not placement:  # how it failed, not how it was placed
        return
    nodes = sorted({slot[0] for slot in placement["slots"]})
    print_wrapped(f"placed in {placement['level']} {placement['domain']}: {', '.join(nodes)}", 2)
    terms = answer.get("score") or []
    if terms:
        print_wrapped("placement score (how this placement ranked):", 2)
    for item in terms:  # the meaning wraps under itself, never under the term
        print_wrapped(item["meaning"], f"    {item['term']:>18} = {item['value']:<6g} ")


def _print_failure(job_id: str, failure: dict[str, Any]) -> None:
    rank, attempt = failure.get("rank"), failure.get("attempt")
    of_attempt = f" (attempt {attempt})" if attempt is not None else ""
    print_wrapped(
        f"failed: rank {rank} on {failure.get('node')}{of_attempt}, {_exit(failure)}", 2, 4
    )
    tail = failure.get("stderr_tail") or []
    if not tail:
        print_wrapped("its stderr is empty", 2)
        return
    print_wrapped(f"its stderr's last {len(tail)} lines:", 2)
    for line in tail:
        print_wrapped(str(line), "    ", 6)
    print_wrapped(f"all of it: aicluster logs {job_id} --rank {rank} --stream stderr", 2, 4)
