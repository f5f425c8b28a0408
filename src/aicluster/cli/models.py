"""Model registry commands: ``aicluster models``, ``aicluster model show|register``."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import typer
from rich.tree import Tree

from aicluster.cli.common import (
    Client,
    api_command,
    console,
    fail,
    readable,
    when,
)
from aicluster.cli.output import Column, Output, OutputOption, print_data, print_records
from aicluster.core.numbers import ascii_int

__all__ = ["register"]

model_app = typer.Typer(help="Show and register model versions.", no_args_is_help=True)
TenantOption = Annotated[str | None, typer.Option(help="the model's tenant, if ambiguous")]
# Checked here too: a name is a URL path segment ("../jobs" must not reach another route).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise fail(f"{name!r} is not a model name (letters, digits, '.', '_', '-')", 2)
    return name


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``NAME`` or ``NAME:VERSION`` → (name, version or None). Raises ``typer.Exit`` if bad."""
    name, sep, version = ref.partition(":")
    number = ascii_int(version)
    if not name or (sep and (number is None or number < 1)):
        raise fail(f"{ref!r}: expected NAME or NAME:VERSION (a version is 1, 2, …)", 2)
    return check_name(name), number if sep else None


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.4g}" for key, value in sorted(metrics.items()))


MODEL_COLUMNS = (
    Column("model", lambda m: m["name"], whole=True),
    Column("tenant", lambda m: m["tenant"], whole=True),
    Column("latest", lambda m: str(m["latest_version"]), whole=True, justify="right"),
    Column("registered", lambda m: when(m["registered_at"]), whole=True, priority=3),
    Column("by", lambda m: m["registered_by"], whole=True, priority=4),
    Column("job", lambda m: m["job_id"] or "-", whole=True, priority=2),
    Column("metrics", lambda m: _metrics(m["metrics"]), priority=1, floor=16),
)


@api_command
def models(
    client: Client,
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    output: OutputOption = Output.table,
) -> None:
    """List registered models with their latest version."""
    with readable():
        found = client.get("/v1/models", tenant=tenant)
    print_records(output, MODEL_COLUMNS, found, empty="no models")


VERSION_COLUMNS = (
    Column("version", lambda v: v["ref"], whole=True),
    Column("registered", lambda v: when(v["registered_at"]), whole=True, priority=3),
    Column("by", lambda v: v["registered_by"], whole=True, priority=4),
    Column("job", lambda v: v["job_id"] or "-", whole=True, priority=2),
    Column("code", lambda v: v["code_version"][:12], whole=True, priority=5),
    Column("metrics", lambda v: _metrics(v["metrics"]), priority=1, floor=16),
    Column("spec hash", lambda v: v["spec_hash"] or "-", whole=True, wide=True),
    Column("dataset hash", lambda v: v["dataset_hash"] or "-", whole=True, wide=True),
)


@model_app.command("show")
@api_command
def show(
    client: Client,
    ref: Annotated[str, typer.Argument(metavar="NAME[:VERSION]", help="a model or one version")],
    tenant: TenantOption = None,
    output: OutputOption = Output.table,
) -> None:
    """A model's versions, or one version's lineage (job, spec hash, exported code, the job's
    shipped code, data, metrics)."""
    name, version = parse_ref(ref)
    with readable():
        client = client
        if version is None:
            versions = client.get(f"/v1/models/{name}", tenant=tenant)
        else:
            versions = [client.get(f"/v1/models/{name}/versions/{version}", tenant=tenant)]
    if version is not None:
        if not print_data(output, versions[0]):
            _lineage(versions[0])
        return
    print_records(output, VERSION_COLUMNS, versions, empty=f"{name} has no versions")


def _lineage(item: dict[str, Any]) -> None:
    console.print(f"[bold]{item['ref']}[/] (tenant {item['tenant']})")
    rows = [
        ("registered", f"{when(item['registered_at'])} by {item['registered_by']}"),
        ("job", item["job_id"] or "-"),
        ("spec hash", item["spec_hash"] or "-"),
        ("code version", item["code_version"]),
        ("job code", item.get("job_code") or "-"),
        ("parent", item.get("parent") or "-"),
        ("dataset hash", item["dataset_hash"] or "-"),
        ("metrics", _metrics(item["metrics"]) or "-"),
        ("entrypoint", item["entrypoint"]),
        ("config", json.dumps(item["config"], sort_keys=True)[:200]),
        ("drift feature", (item.get("drift") or {}).get("feature", "-")),
    ]
    for key, value in rows:
        console.print(f"  {key:>13}  {value}", highlight=False)
    console.print(lineage_tree(item), highlight=False)


def lineage_tree(item: dict[str, Any]) -> Tree:
    """The chain dataset versions -> job -> model version -> deployment, as a tree."""
    datasets = item.get("datasets") or []
    tree = Tree("lineage")
    roots = [
        tree.add(
            f"dataset {d['ref']} sha256 {(d['manifest_sha256'] or '?')[:12]}"
            + (" (deleted)" if d["deleted"] else ""),
        )
        for d in datasets
    ] or [tree.add("no recorded datasets")]
    job = f"job {item['job_id'] or '-'}"
    if item.get("spec_hash"):
        job += f" spec {item['spec_hash'][:12]} code {item['code_version'][:12]}"
    if item.get("parent"):
        job += f" from {item['parent']}"
    for root in roots:
        model = root.add(job).add(f"model {item['ref']}")
        traffic = item.get("traffic")
        model.add("not deployed" if traffic is None else f"deployment {item['name']}: {traffic:g}%")
    return tree


@model_app.command("register")
@api_command
def register_model(
    client: Client,
    job_id: Annotated[str, typer.Argument(help="a SUCCEEDED job that exported a model")],
    name: Annotated[str | None, typer.Option(help="model name (default: the job's)")] = None,
) -> None:
    """Register a job's exported model as a new version (idempotent per job and name)."""
    if not _JOB_ID.match(job_id):
        raise fail(f"{job_id!r} is not a job id", 2)
    with readable():
        client = client
        if name is None:
            spec = client.get(f"/v1/jobs/{job_id}")["spec"]
            name = str((spec.get("model") or {}).get("name") or spec["name"])
        item = client.post(f"/v1/models/{check_name(name)}/versions", {"job_id": job_id})
    console.print(f"registered [bold]{item['ref']}[/] (tenant {item['tenant']}) from {job_id}")


def register(app: typer.Typer) -> None:
    app.command()(models)
    app.add_typer(model_app, name="model")
