"""``aicluster audit``: the audit log (``GET /v1/audit``), newest first, filtered."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Annotated, Any

import typer

from aicluster.cli.common import Client, api_command, err_console, fail, readable
from aicluster.cli.output import Column, Output, OutputOption, print_records
from aicluster.core.durations import DURATION_FORMS, parse_duration

__all__ = ["event_object", "parse_time", "register"]

#: Keys of an event's details that name what it is about (as the server's ``object`` filter).
_OBJECT_KEYS = ("object", "node", "user", "token_id", "name", "model")


def parse_time(value: str, option: str, now: float | None = None) -> float:
    """Unix seconds from a duration ago (``90s``, ``30m``, ``1h``, ``2d``, ``1w``; the job spec's
    parser, :func:`aicluster.core.durations.parse_duration`) or an ISO 8601 time (local time
    unless it names its zone). Raises ``typer.Exit`` with a readable error."""
    now = time.time() if now is None else now
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        raise fail(
            f"{option} {value!r}: give a duration ago ({DURATION_FORMS}) or an ISO time "
            "(2026-11-27T09:30)",
            2,
        ) from None


def event_object(event: dict[str, Any]) -> str:
    """What an event is about: its job, else the object its details name, else its tenant."""
    if event.get("job_id"):
        return str(event["job_id"])
    details = event.get("details") or {}
    for key in _OBJECT_KEYS:
        if details.get(key) not in (None, ""):
            return str(details[key])
    return str(event["tenant"]) if str(event["kind"]).startswith("tenant.") else "-"


def _summary(event: dict[str, Any]) -> str:
    details = dict(event.get("details") or {})
    if str(event["kind"]).startswith("api."):
        return f"{details.get('method')} {details.get('route')} -> {details.get('status')} " + (
            str(details.get("outcome", ""))
        )
    moved = ""
    if event.get("from_state") or event.get("to_state"):
        moved = f"{event.get('from_state') or '-'} -> {event.get('to_state') or '-'} "
    rest = {k: v for k, v in details.items() if k not in _OBJECT_KEYS and k != "placement"}
    text = str(rest.pop("reason", "")) if set(rest) == {"reason"} else ""
    if rest and not text:
        text = json.dumps(rest, separators=(",", ":"), sort_keys=True)
    return (moved + text).strip()


def _time(event: dict[str, Any]) -> str:
    return datetime.fromtimestamp(float(event["at"])).strftime("%Y-%m-%d %H:%M:%S")


COLUMNS = (
    Column("id", lambda e: str(e["id"]), whole=True, justify="right"),
    Column("time", _time, whole=True),
    Column("actor", lambda e: e["actor"], whole=True),
    Column("action", lambda e: e["kind"], whole=True),
    Column("tenant", lambda e: e["tenant"] or "-", whole=True, priority=2),
    Column("object", event_object, priority=1, floor=16),
    Column("what", _summary, priority=3, floor=16),
    Column("details", lambda e: json.dumps(e["details"], sort_keys=True), wide=True, floor=24),
)


@api_command
def audit(
    client: Client,
    since: Annotated[
        str | None, typer.Option(help="from: a duration ago (30m, 1h, 2d) or an ISO time")
    ] = None,
    until: Annotated[str | None, typer.Option(help="before: a duration ago or an ISO time")] = None,
    actor: Annotated[
        str | None, typer.Option(help="who acted: a user, or control (the scheduler)")
    ] = None,
    action: Annotated[
        str | None,
        typer.Option(help="an event kind (api.submit_job), or a prefix ending in '.' (job.)"),
    ] = None,
    object_: Annotated[
        str | None,
        typer.Option("--object", help="a job id, or a node, user, token id, model or tenant"),
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant's events")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="events per page")] = 50,
    cursor: Annotated[
        int | None, typer.Option(min=0, help="the page after this cursor (printed when more)")
    ] = None,
    oldest_first: Annotated[bool, typer.Option("--oldest-first", help="oldest first")] = False,
    output: OutputOption = Output.table,
) -> None:
    """The audit log: API calls that changed something, the changes, the scheduler's moves.

    A cluster admin sees every event; anyone else only its tenants' events."""
    params = {
        "since": parse_time(since, "--since") if since else None,
        "until": parse_time(until, "--until") if until else None,
        "actor": actor,
        "action": action,
        "object": object_,
        "tenant": tenant,
        "limit": limit,
        "cursor": cursor,
        "order": "oldest" if oldest_first else "newest",
    }
    with readable():
        page = client.get("/v1/audit", **params)
    print_records(output, COLUMNS, page["items"], data=page, empty="no events")
    if page["next_cursor"] is not None and output in (Output.table, Output.wide):
        err_console.print(f"more: add --cursor {page['next_cursor']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)
