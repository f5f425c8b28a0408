"""Serving commands: serve, deployments, undeploy, predict."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer

from aicluster.cli.client import ApiError
from aicluster.cli.common import (
    Client,
    api_command,
    console,
    fail,
    readable,
    when,
)
from aicluster.cli.output import Column, Output, OutputOption, print_records
from aicluster.core.numbers import ascii_int

__all__ = ["register"]

TenantOption = Annotated[str | None, typer.Option(help="the model's tenant (if you have several)")]


def _model_ref(ref: str) -> tuple[str, int]:
    name, _, version = ref.partition(":")
    number = ascii_int(version)
    if not name or number is None or number < 1:
        raise fail(f"say which version to serve as NAME:VERSION (e.g. gpt:2), not {ref!r}", 2)
    return name, number


@api_command
def serve(
    client: Client,
    ref: Annotated[str, typer.Argument(metavar="NAME:VERSION", help="the model version")],
    replicas: Annotated[int | None, typer.Option(help="a fixed number of replicas")] = None,
    min_replicas: Annotated[int | None, typer.Option(help="autoscaling: fewest replicas")] = None,
    max_replicas: Annotated[int | None, typer.Option(help="autoscaling: most replicas")] = None,
    target_ongoing: Annotated[
        float | None, typer.Option(help="autoscaling: requests in flight per replica")
    ] = None,
    gpus: Annotated[int | None, typer.Option(help="GPUs per replica (default none)")] = None,
    cpus: Annotated[float | None, typer.Option(help="CPUs per replica (default 1)")] = None,
    memory_gb: Annotated[
        float | None, typer.Option(help="memory per replica, in GB (default 1)")
    ] = None,
    tenant: TenantOption = None,
    wait: Annotated[bool, typer.Option(help="wait until it serves")] = True,
    timeout: Annotated[float, typer.Option(help="seconds to wait")] = 300.0,
) -> None:
    """Serve a model version. Each replica is a job of kind service that the scheduler places
    under the tenant's quotas. On a deployment serving another version this is a rolling
    update: the new version starts, takes all traffic once healthy, and the old one drains."""
    name, version = _model_ref(ref)
    body: dict[str, Any] = {"model": name, "version": version, "tenant": tenant}
    body |= {"replicas": replicas, "min_replicas": min_replicas, "max_replicas": max_replicas}
    body |= {"target_ongoing_requests": target_ongoing, "gpus": gpus}
    body |= {"cpus": cpus, "memory_gb": memory_gb}
    with readable():
        client = client
        out = client.post("/v1/deployments", {k: v for k, v in body.items() if v is not None})
        rolling = f" (rolling update to v{version})" if out["promote_to"] else ""
        console.print(f"deploying [bold]{name}:{version}[/]{rolling}: {out['endpoint']}")
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while not _serving(out, version):
            if time.monotonic() > deadline:
                raise ApiError(
                    f"{name}:{version} is not serving after {timeout:g}s: its replicas are jobs "
                    "of kind service that wait for the scheduler (`aicluster jobs -o wide` "
                    "lists them, `aicluster why JOB` says why)"
                )
            time.sleep(1.0)
            out = client.get(f"/v1/deployments/{name}", tenant=out["tenant"])
    console.print(f"[green]serving[/] {name}:{version} on {_healthy(out)} replica(s)")


def _serving(out: dict[str, Any], version: int) -> bool:
    versions = out["versions"]
    if [v["version"] for v in versions] != [version]:
        return False
    low = int(str(versions[0]["desired_replicas"]).split("-")[0])
    return int(versions[0]["healthy_replicas"]) >= max(1, low)


def _healthy(out: dict[str, Any]) -> int:
    return sum(int(v["healthy_replicas"]) for v in out["versions"])


def _holds(out: dict[str, Any]) -> str:
    """What one replica holds: ``1 GPU, 2 CPU, 4 GB``."""
    gpus = int(out["scaling"].get("gpus", 0))
    held = [f"{gpus} GPU"] if gpus else []
    return ", ".join([*held, f"{out['cpus']:g} CPU", f"{out['memory_gb']:g} GB"])


def _traffic(out: dict[str, Any]) -> str:
    versions = ", ".join(f"v{v['version']} {v['weight']:g}%" for v in out["versions"])
    return versions + (f" → v{out['promote_to']}" if out["promote_to"] else "")


def _replicas(out: dict[str, Any]) -> str:
    return ", ".join(
        f"v{v['version']} {v['healthy_replicas']}/{v['desired_replicas']}" for v in out["versions"]
    )


DEPLOYMENT_COLUMNS = (
    Column("name", lambda out: out["name"], whole=True),
    Column("tenant", lambda out: out["tenant"], whole=True),
    Column("versions (traffic)", _traffic, floor=10),
    Column("replicas healthy/desired", _replicas, floor=8),
    Column("per replica", _holds, floor=6),
    # An address is copied whole or not at all: it goes before it would fold.
    Column("endpoint", lambda out: out["endpoint"], whole=True, priority=1),
    Column("by", lambda out: out["created_by"], whole=True, wide=True),
    Column("updated", lambda out: when(out["updated_at"]), whole=True, wide=True),
)


@api_command
def deployments(
    client: Client,
    tenant: TenantOption = None,
    output: OutputOption = Output.table,
) -> None:
    """Deployed models: versions and traffic weights, healthy/desired replicas, endpoint."""
    with readable():
        found = client.get("/v1/deployments", tenant=tenant)
    print_records(output, DEPLOYMENT_COLUMNS, found, empty="no deployments")


@api_command
def undeploy(
    client: Client,
    name: str,
    tenant: TenantOption = None,
) -> None:
    """Stop serving a model (its replicas drain, then stop)."""
    with readable():
        client.request(
            "DELETE", f"/v1/deployments/{name}", params={"tenant": tenant} if tenant else None
        )
    console.print(f"undeployed {name}")


@api_command
def predict(
    client: Client,
    name: str,
    inputs: Annotated[str, typer.Option("--json", help="the inputs, a JSON object")],
    tenant: TenantOption = None,
) -> None:
    """Run a served model on one input and print its answer (JSON)."""
    try:
        body = json.loads(inputs)
    except ValueError as error:
        raise fail(f"--json is not valid JSON: {error}", 2) from None
    if not isinstance(body, dict):
        raise fail("--json must be a JSON object", 2)
    with readable():
        answer = client.request(
            "POST",
            f"/v1/models/{name}/predict",
            json=body,
            params={"tenant": tenant} if tenant else None,
        )
    console.print_json(data=answer)


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(deployments)
    app.command()(undeploy)
    app.command()(predict)
