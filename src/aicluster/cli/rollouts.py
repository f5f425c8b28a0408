"""``aicluster rollout``: canary rollouts of a served model.

One command, as in the issue: ``aicluster rollout NAME:VERSION --steps 10,25,50,100 --interval 30s
--max-error-rate 1% --max-p99-ms 500`` starts one (``--wait`` follows it to its end);
``aicluster rollout NAME --status | --promote | --abort`` shows or ends the current one. Flags
rather than subcommands keep the start line exactly the issue's and the rest one word away.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from aicluster.cli.common import (
    Client,
    api_command,
    console,
    fail,
    readable,
    when,
)
from aicluster.cli.output import Column, Output, OutputOption, print_data, print_records
from aicluster.core import durations
from aicluster.core.numbers import ascii_int

__all__ = ["parse_duration", "parse_rate", "parse_steps", "register"]


def parse_duration(text: str) -> float:
    """Seconds from ``30s``, ``2m``, ``1h``, ``500ms`` or a bare number of seconds: the job
    spec's parser (:func:`aicluster.core.durations.parse_duration`), as a flag's error."""
    try:
        return durations.parse_duration(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def parse_rate(text: str) -> float:
    """A fraction from ``1%`` or ``0.01``."""
    value = text.strip()
    try:
        rate = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a rate (e.g. 1% or 0.01)") from None
    if not 0 <= rate <= 1:
        raise typer.BadParameter(f"{text!r}: give a fraction in [0, 1] (0.01) or a percent (1%)")
    return rate


def parse_steps(text: str) -> list[int]:
    """Percentages from ``10,25,50,100`` (the API checks they increase and end at 100)."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: steps are whole percentages, e.g. 10,25,50,100"
        ) from None


def _target(text: str) -> tuple[str, int | None]:
    name, _, version = text.partition(":")
    number = ascii_int(version)
    if not name or (version and number is None):
        raise typer.BadParameter(f"{text!r}: expected NAME or NAME:VERSION (e.g. gpt:2)")
    return name, number


@api_command
def rollout(
    client: Client,
    target: Annotated[str, typer.Argument(help="NAME:VERSION to start; NAME with an action")],
    steps: Annotated[str, typer.Option(help="traffic percentages, ending at 100")] = "10,25,50,100",
    interval: Annotated[str, typer.Option(help="how long each step is held: 30s, 2m")] = "30s",
    max_error_rate: Annotated[str, typer.Option(help="roll back above this: 1% or 0.01")] = "1%",
    max_p99_ms: Annotated[float, typer.Option(help="roll back above this p99 latency")] = 500.0,
    status: Annotated[bool, typer.Option("--status", help="show the latest rollout")] = False,
    promote: Annotated[bool, typer.Option("--promote", help="send all traffic to it now")] = False,
    abort: Annotated[bool, typer.Option("--abort", help="send all traffic back now")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="follow it until it ends")] = False,
    tenant: Annotated[str | None, typer.Option(help="the model's tenant if ambiguous")] = None,
    output: OutputOption = Output.table,
) -> None:
    """Roll a model version out in canary steps, rolled back by itself when unhealthy."""
    name, version = _target(target)
    actions = [flag for flag, on in (("--status", status), ("--promote", promote),
                                     ("--abort", abort)) if on]  # fmt: skip
    if len(actions) > 1:
        raise fail(f"choose one of {', '.join(actions)}", 2)
    if actions and version is not None:
        raise fail(f"{actions[0]} takes the model NAME, not NAME:VERSION", 2)
    if not actions and version is None:
        raise fail(
            "give NAME:VERSION to start a rollout, or NAME with --status, --promote or --abort",
            2,
        )
    base = f"/v1/models/{name}/rollouts"
    params = {"tenant": tenant} if tenant else {}
    with readable():
        client = client
        if status:
            _show_latest(client, base, params, output)
            return
        if promote or abort:
            verb = "promote" if promote else "abort"
            done = client.post(f"{base}/current/{verb}", params=params)
            if not print_data(output, done):
                console.print(f"{name}: rollout {done['id']} {done['state']} ({done['reason']})")
            return
        body = {
            "version": version,
            "steps": parse_steps(steps),
            "interval_s": parse_duration(interval),
            "max_error_rate": parse_rate(max_error_rate),
            "max_p99_ms": max_p99_ms,
        }
        started = client.post(base, body, params=params)
        if output in (Output.json, Output.yaml):  # the record: at its end with --wait
            ended = _follow(client, f"{base}/{started['id']}", params, quiet=True) if wait else None
            print_data(output, ended or started)
            if ended is not None and ended["state"] != "promoted":
                raise typer.Exit(1)
            return
        console.print(
            f"{name}: rollout [bold]{started['id']}[/] of v{started['to_version']} over "
            f"v{started['from_version']}: steps {started['steps']} every "
            f"{started['interval_s']:g} s (max error rate {100 * started['max_error_rate']:g}%, "
            f"max p99 {started['max_p99_ms']:g} ms)"
        )
        if wait:
            _follow(client, f"{base}/{started['id']}", params)


def _show_latest(client: Client, base: str, params: dict[str, str], output: Output) -> None:
    listed = client.get(base, **params)
    latest = client.get(f"{base}/{listed[0]['id']}", **params) if listed else None
    if print_data(output, latest):
        return
    if latest is None:
        console.print("no rollouts yet")
        return
    _print(latest, output)


def _follow(
    client: Client, path: str, params: dict[str, str], quiet: bool = False
) -> dict[str, Any]:
    """Print the rollout's events as they come (none if ``quiet``) until it ends; exit 1 if
    it ends other than promoted, unless ``quiet``: then the caller decides. The last record."""
    seen = 0
    while True:
        rollout: dict[str, Any] = client.get(path, **params)
        for event in [] if quiet else rollout["events"][seen:]:
            console.print(f"{when(event['at'])}  {_describe(event)}", highlight=False)
        seen = len(rollout["events"])
        if rollout["state"] != "running":
            if rollout["state"] != "promoted" and not quiet:
                raise typer.Exit(1)
            return rollout
        time.sleep(1)


def _figures(event: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = event["details"].get("figures", {})
    return figures


EVENT_COLUMNS = (
    Column("time", lambda e: when(e["at"]), whole=True),
    Column("event", lambda e: e["kind"].removeprefix("rollout."), whole=True),
    Column("weight", lambda e: f"{e['details'].get('weight', 0)}%", whole=True, justify="right"),
    Column(
        "requests",
        lambda e: str(_figures(e).get("requests", "")),
        whole=True,
        priority=2,
        justify="right",
    ),
    Column(
        "errors",
        lambda e: str(_figures(e).get("errors", "")),
        whole=True,
        priority=2,
        justify="right",
    ),
    Column(
        "p99",
        lambda e: _ms(_figures(e).get("p99_ms")) if "requests" in _figures(e) else "",
        whole=True,
        priority=3,
        justify="right",
    ),
    Column("why", lambda e: str(e["details"].get("reason", "")), priority=1, floor=16),
    Column("actor", lambda e: e["actor"], whole=True, wide=True),
)


def _print(rollout: dict[str, Any], output: Output = Output.table) -> None:
    step = rollout["step_index"]
    where = "starting the new version" if step < 0 else (
        f"step {step + 1}/{len(rollout['steps'])} ({rollout['weight']}%)")  # fmt: skip
    state = rollout["state"] if rollout["state"] != "running" else f"running, {where}"
    console.print(
        f"[bold]{rollout['name']}[/]: rollout {rollout['id']} of v{rollout['to_version']} over "
        f"v{rollout['from_version']} — {state}"
        + (f": {rollout['reason']}" if rollout["reason"] else "")
    )
    live = rollout.get("live")
    if live:
        console.print(
            f"this step so far: {live['requests']} requests, {live['errors']} errors, "
            f"p99 {_ms(live['p99_ms'])}"
        )
    print_records(output, EVENT_COLUMNS, rollout["events"])


def _describe(event: dict[str, Any]) -> str:
    details = event["details"]
    kind = event["kind"].removeprefix("rollout.")
    return f"{kind:<12} {details.get('weight', 0):>3}%  {details.get('reason', '')}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout)
