"""``aicluster usage``: GPU-hours, CPU-hours and kWh per tenant and per job
(``GET /v1/usage``), as a table, JSON, or CSV for a spreadsheet."""

from __future__ import annotations

import csv
import io
from enum import StrEnum
from typing import Annotated, Any

import typer

from aicluster.cli.audit import parse_time
from aicluster.cli.common import Client, api_command, readable
from aicluster.cli.output import Column, Output, print_data, print_records

__all__ = ["register"]

_JOB_FIELDS = (
    "tenant",
    "job_id",
    "name",
    "gpus",
    "cpus",
    "run_seconds",
    "gpu_hours",
    "cpu_hours",
    "kwh",
)


class UsageOutput(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _hours(key: str) -> Column:
    return Column(key.replace("_", "-"), lambda r: f"{r[key]:,.3f}", whole=True, justify="right")


TENANT_COLUMNS = (
    Column("tenant", lambda r: r["tenant"], whole=True),
    Column("jobs", lambda r: str(r["jobs"]), whole=True, justify="right"),
    _hours("gpu_hours"),
    _hours("cpu_hours"),
    _hours("kwh"),
)


@api_command
def usage(
    client: Client,
    since: Annotated[
        str | None, typer.Option(help="from: a duration ago (30m, 1h, 2d) or an ISO time")
    ] = None,
    until: Annotated[str | None, typer.Option(help="before: a duration ago or an ISO time")] = None,
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    output: Annotated[
        UsageOutput,
        typer.Option("--output", "-o", help="table (per tenant), json, or csv (per job)"),
    ] = UsageOutput.table,
) -> None:
    """What each tenant's jobs used: GPU-hours, CPU-hours and kWh (the power model's).

    A cluster admin sees every tenant; anyone else only its own tenants."""
    params = {
        "since": parse_time(since, "--since") if since else None,
        "until": parse_time(until, "--until") if until else None,
        "tenant": tenant,
    }
    with readable():
        data = client.get("/v1/usage", **params)
    if output is UsageOutput.json:
        print_data(Output.json, data)
    elif output is UsageOutput.csv:
        typer.echo(_csv(data["jobs"]), nl=False)
    else:
        print_records(Output.table, TENANT_COLUMNS, data["tenants"], empty="no usage")


def _csv(jobs: list[dict[str, Any]]) -> str:
    """One row per job, the accountant's columns, with a header."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_JOB_FIELDS)
    for job in jobs:
        writer.writerow([job[field] for field in _JOB_FIELDS])
    return buffer.getvalue()


def register(app: typer.Typer) -> None:
    app.command("usage")(usage)
