"""Continuous-learning pipelines: ``aicluster pipeline create|list|show|pause|resume|delete``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from aicluster.cli.common import Client, api_command, console, fail, readable, when
from aicluster.cli.jobs import member_tenant, ship_code
from aicluster.cli.output import Column, Output, OutputOption, print_data, print_records
from aicluster.core import ConfigError, jobspec_from_mapping
from aicluster.core.bounded import BoundedLoader

__all__ = ["register"]

pipeline_app = typer.Typer(help="Retrain a served model when its data moves.", no_args_is_help=True)
TenantOption = Annotated[str | None, typer.Option(help="the pipeline's tenant")]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class _Loader(BoundedLoader):
    what = "a pipeline"


def _name(name: str) -> str:
    if not _NAME.match(name):
        raise fail(f"{name!r} is not a pipeline name (letters, digits, '.', '_', '-')", 2)
    return name


def _read(path: Path) -> dict[str, Any]:
    """The file's mapping (YAML or JSON); readable errors, never a traceback."""
    try:
        data = yaml.load(path.read_text(), Loader=_Loader)  # a SafeLoader subclass
    except (yaml.YAMLError, ValueError) as error:
        raise ConfigError(str(path), None, f"not valid YAML: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("job"), dict):
        raise ConfigError(str(path), None, "expected a mapping: name, deployment, job, triggers")
    return data


@pipeline_app.command("create")
@api_command
def create(
    client: Client,
    file: Annotated[
        Path, typer.Option("-f", "--file", exists=True, dir_okay=False, help="pipeline.yaml")
    ],
    tenant: TenantOption = None,
) -> None:
    """Create a pipeline from a file; ships its job's code (the job's workdir, else the file's
    folder) as `aicluster submit` does."""
    with readable():
        data = _read(file)
        owner = tenant or data.get("tenant") or member_tenant(client)
        job = jobspec_from_mapping(data["job"], f"{file}: job")
        if job.code is None:
            job, _, _ = ship_code(client, file, job, owner)
        body = {**data, "tenant": owner, "job": job.canonical_dict()}
        item = client.post(f"/v1/tenants/{owner}/pipelines", body)
    console.print(
        f"created pipeline [bold]{item['name']}[/] (tenant {owner}) for {item['deployment']}: "
        + "; ".join(item["triggers"]),
        highlight=False,
    )


def _last_run(p: dict[str, Any]) -> str:
    if not p["runs"]:
        return "-"
    run = p["runs"][0]
    return f"{run['state']} ({when(run['started_at'])})"


COLUMNS = (
    Column("pipeline", lambda p: p["name"], whole=True),
    Column("tenant", lambda p: p["tenant"], whole=True),
    Column("deployment", lambda p: p["deployment"], whole=True),
    Column("state", lambda p: "paused" if p["paused"] else "active", whole=True),
    Column("last run", _last_run, whole=True, priority=2),
    Column("triggers", lambda p: "; ".join(p["triggers"]), priority=1, floor=16),
)


@pipeline_app.command("list")
@api_command
def list_pipelines(
    client: Client, tenant: TenantOption = None, output: OutputOption = Output.table
) -> None:
    """The tenant's pipelines with their last run."""
    with readable():
        owner = tenant or member_tenant(client, viewer=True)
        found = client.get(f"/v1/tenants/{owner}/pipelines")
    print_records(output, COLUMNS, found, empty="no pipelines")


@pipeline_app.command("show")
@api_command
def show(
    client: Client, name: str, tenant: TenantOption = None, output: OutputOption = Output.table
) -> None:
    """One pipeline: its triggers and its runs (why each fired, its job, model and outcome)."""
    with readable():
        owner = tenant or member_tenant(client, viewer=True)
        item = client.get(f"/v1/tenants/{owner}/pipelines/{_name(name)}")
    if print_data(output, item):
        return
    state = "paused" if item["paused"] else "active"
    console.print(f"[bold]{item['name']}[/] (tenant {owner}, {state})", highlight=False)
    console.print(f"  deployment  {item['deployment']}", highlight=False)
    console.print(f"    triggers  {'; '.join(item['triggers'])}", highlight=False)
    for run in item["runs"]:
        model = f"{item['deployment']}:{run['model_version']}" if run["model_version"] else "-"
        console.print(
            f"  run {run['id']:>4}  {run['state']:<11} {when(run['started_at'])}  "
            f"job {run['job_id'] or '-'}  model {model}  {'; '.join(run['reasons'])}"
            + (f"  ({run['detail']})" if run["detail"] else ""),
            highlight=False,
        )


def _change(client: Client, name: str, tenant: str | None, action: str) -> dict[str, Any]:
    owner = tenant or member_tenant(client)
    item: dict[str, Any] = client.post(f"/v1/tenants/{owner}/pipelines/{_name(name)}/{action}")
    return item


@pipeline_app.command("pause")
@api_command
def pause(client: Client, name: str, tenant: TenantOption = None) -> None:
    """Stop firing (a run in progress goes on)."""
    with readable():
        _change(client, name, tenant, "pause")
    console.print(f"paused {name}", highlight=False)


@pipeline_app.command("resume")
@api_command
def resume(client: Client, name: str, tenant: TenantOption = None) -> None:
    """Fire again when a trigger holds."""
    with readable():
        _change(client, name, tenant, "resume")
    console.print(f"resumed {name}", highlight=False)


@pipeline_app.command("delete")
@api_command
def delete(client: Client, name: str, tenant: TenantOption = None) -> None:
    """Delete a pipeline (a job or canary it started goes on by itself)."""
    with readable():
        owner = tenant or member_tenant(client)
        client.delete(f"/v1/tenants/{owner}/pipelines/{_name(name)}")
    console.print(f"deleted {name}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(pipeline_app, name="pipeline")
