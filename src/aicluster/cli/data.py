"""Dataset commands: ``aicluster data push | ls | show | rm | policy``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.filesize import decimal
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from aicluster.artifacts.shards import (
    DEFAULT_SHARD_BYTES,
    DatasetError,
    FolderPlan,
    check_dataset_name,
    plan_folder,
    shard_chunks,
)
from aicluster.cli.client import ApiError
from aicluster.cli.common import Client, api_command, console, err_console, fail, readable, when
from aicluster.cli.jobs import member_tenant
from aicluster.cli.output import Column, Output, OutputOption, print_data, print_records

__all__ = ["register"]

data_app = typer.Typer(help="Datasets: versioned, per tenant, read by jobs through node caches.")
TenantOption = Annotated[str | None, typer.Option(help="the tenant (default: your only one)")]
_REF = re.compile(r"^([a-z0-9][a-z0-9._-]{0,62}):(latest|[1-9][0-9]{0,8})$")


def _ref(text: str) -> tuple[str, str]:
    found = _REF.fullmatch(text)
    if found is None:
        raise fail(f"{text!r}: give NAME:VERSION (a number, or latest)", 2)
    return found.group(1), found.group(2)


@data_app.command("push")
@api_command
def push(
    client: Client,
    folder: Annotated[Path, typer.Argument(help="the folder to push", file_okay=False)],
    name: Annotated[str, typer.Option("--name", help="the dataset's name")],
    tenant: TenantOption = None,
    shard_mb: Annotated[
        int, typer.Option(min=1, max=256, help="shard size (MiB)")
    ] = DEFAULT_SHARD_BYTES >> 20,
) -> None:
    """Push FOLDER as the next version of dataset NAME (only shards the tenant lacks go)."""
    with readable():
        try:
            check_dataset_name(name)
            plan = plan_folder(folder, shard_mb << 20)
        except DatasetError as error:
            raise ApiError(str(error)) from None
        owner = tenant or member_tenant(client)
        sent = _upload_missing(client, owner, plan)
        pushed = client.post(f"/v1/tenants/{owner}/datasets/{name}/versions", plan.manifest())
    console.print(
        f"pushed [bold]{pushed['name']}:{pushed['version']}[/] (tenant {owner}): "
        f"{pushed['files']} files, {decimal(pushed['bytes'])} in {pushed['shards']} shards, "
        f"{decimal(sent)} sent",
        highlight=False,
    )
    if pushed["removed"]:
        console.print(f"retention removed {', '.join(pushed['removed'])}", highlight=False)


def _upload_missing(client: Client, tenant: str, plan: FolderPlan) -> int:
    """Upload the shards the tenant's store lacks, streamed, with a progress bar; bytes sent."""
    base = f"/v1/tenants/{tenant}/datasets/shards"
    missing = [i for i, s in enumerate(plan.shards) if not client.exists(f"{base}/{s['sha256']}")]
    total = sum(int(plan.shards[i]["size"]) for i in missing)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn())
    timing = (TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, *timing, console=err_console, transient=True) as progress:
        task = progress.add_task("uploading", total=total)

        def counted(index: int) -> Any:
            for chunk in shard_chunks(plan, index):
                progress.advance(task, len(chunk))
                yield chunk

        for index in missing:
            body = counted(index)
            client.request(
                "POST",
                f"{base}/{plan.shards[index]['sha256']}",
                content=body,
                headers={"Content-Type": "application/octet-stream"},
            )
    return total


VERSION_COLUMNS = (
    Column("dataset", lambda v: f"{v['name']}:{v['version']}", whole=True),
    Column("files", lambda v: str(v["files"]), whole=True, justify="right", priority=2),
    Column("bytes", lambda v: decimal(v["bytes"]), whole=True, justify="right", priority=1),
    Column("shards", lambda v: str(v["shards"]), whole=True, justify="right", priority=3),
    Column("pushed by", lambda v: v["pushed_by"], whole=True, priority=4),
    Column("pushed", lambda v: when(v["pushed_at"]), whole=True, priority=5),
    Column("manifest", lambda v: v["manifest_sha256"], whole=True, wide=True),
)


@data_app.command("ls")
@api_command
def ls(client: Client, tenant: TenantOption = None, output: OutputOption = Output.table) -> None:
    """The tenant's dataset versions, newest first."""
    with readable():
        owner = tenant or member_tenant(client, viewer=True)
        found = client.get(f"/v1/tenants/{owner}/datasets")
    print_records(output, VERSION_COLUMNS, found["versions"], data=found, empty="no datasets")


@data_app.command("show")
@api_command
def show(
    client: Client,
    ref: Annotated[
        str, typer.Argument(metavar="NAME:VERSION", help="e.g. corpus:3, corpus:latest")
    ],
    tenant: TenantOption = None,
    output: OutputOption = Output.table,
) -> None:
    """One version: files, shards, bytes, who pushed it and when, which jobs read it and which
    model versions were trained on it."""
    name, version = _ref(ref)
    with readable():
        owner = tenant or member_tenant(client, viewer=True)
        item = client.get(f"/v1/tenants/{owner}/datasets/{name}/versions/{version}")
    if print_data(output, item):
        return
    console.print(f"[bold]{item['name']}:{item['version']}[/] (tenant {owner})")
    rows = [
        ("pushed", f"{when(item['pushed_at'])} by {item['pushed_by']}"),
        ("bytes", f"{decimal(item['bytes'])} in {item['files']} files, {item['shards']} shards"),
        ("manifest", item["manifest_sha256"]),
        ("used by", ", ".join(item["used_by"]) or "-"),
        ("models", ", ".join(item.get("models", [])) or "-"),
    ]
    for key, value in rows:
        console.print(f"  {key:>9}  {value}", highlight=False)
    for file in item["files_list"]:
        console.print(f"  {decimal(file['size']):>10}  {file['path']}", highlight=False)
    for shard in item["shards_list"]:
        console.print(f"  shard {shard['sha256']}  {decimal(shard['size'])}", highlight=False)


@data_app.command("rm")
@api_command
def rm(
    client: Client,
    ref: Annotated[str, typer.Argument(metavar="NAME:VERSION")],
    tenant: TenantOption = None,
) -> None:
    """Delete a version (refused while a job that has not finished reads it)."""
    name, version = _ref(ref)
    if version == "latest":
        raise fail("rm takes a version number, not latest", 2)
    with readable():
        owner = tenant or member_tenant(client)
        client.delete(f"/v1/tenants/{owner}/datasets/{name}/versions/{version}")
    console.print(f"deleted {name}:{version} (tenant {owner})", highlight=False)


@data_app.command("policy")
@api_command
def policy(
    client: Client,
    tenant: Annotated[str, typer.Argument(help="the tenant")],
    quota_bytes: Annotated[int | None, typer.Option(min=0, help="data quota (bytes)")] = None,
    keep_versions: Annotated[int | None, typer.Option(min=1, help="keep the last N")] = None,
    keep_days: Annotated[float | None, typer.Option(min=0.001, help="keep D days")] = None,
) -> None:
    """Show a tenant's data quota and retention; with options, set them (cluster admin)."""
    path = f"/v1/tenants/{tenant}/data-policy"
    with readable():
        if quota_bytes is not None or keep_versions is not None or keep_days is not None:
            body = {"quota_bytes": quota_bytes, "keep_versions": keep_versions}
            client.put(path, {**body, "keep_days": keep_days})
        shown = client.get(path)
    keep = [f"the last {shown['keep_versions']} versions"] if shown["keep_versions"] else []
    keep += [f"{shown['keep_days']:g} days"] if shown["keep_days"] else []
    console.print(
        f"tenant {tenant}: data quota {decimal(shown['quota_bytes'])}; "
        f"keeps {' and '.join(keep) or 'every version'}",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
