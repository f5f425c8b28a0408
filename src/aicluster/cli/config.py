"""``aicluster config``: show the live scheduler configuration, apply a new one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aicluster.cli.common import Client, api_command, fail, readable, when
from aicluster.cli.output import Output, OutputOption, print_data, stdout_console
from aicluster.configuration import parse_configuration

__all__ = ["register"]

config_app = typer.Typer(
    help="The scheduler configuration (docs/config.md): show it, apply a file.",
    no_args_is_help=True,
)


@config_app.command("show")
@api_command
def show(client: Client, output: OutputOption = Output.yaml) -> None:
    """Print the live configuration, its policy named first (and your tenants' quotas)."""
    with readable():
        record = client.get("/v1/config")
    if output in (Output.table, Output.wide):
        output = Output.yaml  # a configuration is a document, not a listing
    if output is Output.yaml:
        _header(record)
    print_data(output, record if output is Output.json else _document(record))


@config_app.command("apply")
@api_command
def apply(
    client: Client,
    file: Annotated[Path, typer.Argument(help="configuration YAML file")],
) -> None:
    """Validate FILE and make it live at the next scheduling cycle (cluster admins)."""
    with readable():
        text = file.read_text()
        parse_configuration(text, str(file))  # the same check as the server's, before sending
        record = client.request(
            "PUT",
            "/v1/config",
            params={"source": file.name[:255] or "config"},
            content=text.encode(),
            headers={"Content-Type": "application/yaml"},
        )
    if record is None:
        raise fail("the server gave no answer")
    stdout_console().print(
        f"configuration {record['id']} applied (policy {record['policy']}): "
        "live at the next scheduling cycle",
        highlight=False,
    )


def _header(record: dict[str, Any]) -> None:
    if record["id"]:
        origin = f"configuration {record['id']} from {record['source']}, applied by "
        origin += f"{record['applied_by']} at {when(record['applied_at'])}"
    else:
        origin = "no configuration applied: the documented defaults (docs/config.md)"
    typer.echo(f"# policy: {record['policy']}\n# {origin}")


def _document(record: dict[str, Any]) -> dict[str, Any]:
    """What ``config show`` prints as YAML: the file's sections, then the visible tenants."""
    tenants = [
        {key: tenant[key] for key in ("name", "quota", "borrow_limit", "weight")}
        for tenant in record["tenants"]
    ]
    return {**record["configuration"], "tenants": tenants}


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
