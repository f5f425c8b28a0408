"""Operator commands: tenants, users, tokens, nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from aicluster.cli.common import (
    CaOption,
    Client,
    HomeOption,
    TokenOption,
    UrlOption,
    api_command,
    client_for,
    console,
    readable,
    when,
)
from aicluster.cli.output import Column, Output, OutputOption, print_records
from aicluster.core.numbers import ascii_int

__all__ = ["register"]

tenants_app = typer.Typer(
    help="Tenants: quotas, borrowing limits, fair-share weights.", no_args_is_help=True
)
tokens_app = typer.Typer(help="Bearer tokens (stored hashed; shown once).", no_args_is_help=True)
users_app = typer.Typer(help="Users and their roles per tenant.", no_args_is_help=True)
nodes_app = typer.Typer(help="Nodes: list, cordon, uncordon.", invoke_without_command=True)


def _quota(pairs: list[str] | None) -> dict[str, int]:
    """``A100=64`` pairs as a mapping; a readable error otherwise."""
    result: dict[str, int] = {}
    for pair in pairs or []:
        name, _, amount = pair.partition("=")
        count = ascii_int(amount)
        if not name or count is None:
            raise typer.BadParameter(f"expected GPU_TYPE=COUNT, got {pair!r}")
        result[name] = count
    return result


def show(amounts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in amounts.items()) or "-"


def _caps(tenant: dict[str, Any]) -> str:
    cpus, memory = tenant.get("cpu_quota"), tenant.get("memory_quota_gb")
    parts = ([f"{cpus:g} CPUs"] if cpus is not None else []) + (
        [f"{memory:g} GB"] if memory is not None else []
    )
    return ", ".join(parts) or "-"


TENANT_COLUMNS = (
    Column("tenant", lambda t: t["name"], whole=True),
    Column("quota", lambda t: show(t["quota"]), floor=10),
    Column("may borrow", lambda t: show(t["borrow_limit"]), priority=2, floor=10),
    Column("weight", lambda t: f"{t['weight']:g}", whole=True, priority=3, justify="right"),
    Column("CPU/memory caps", lambda t: _caps(t), priority=4, floor=8),
    Column("in use", lambda t: show(t["used"]), priority=1, floor=10),
)


@tenants_app.command("list")
@api_command
def tenants_list(client: Client, output: OutputOption = Output.table) -> None:
    """Tenants you can see, with quota, borrowing limit and current use."""
    with readable():
        tenants = client.get("/v1/tenants")
    print_records(output, TENANT_COLUMNS, tenants, empty="no tenants")


@tenants_app.command("set")
@api_command
def tenants_set(
    client: Client,
    name: str,
    quota: Annotated[list[str] | None, typer.Option(help="GPU_TYPE=COUNT, repeatable")] = None,
    borrow: Annotated[list[str] | None, typer.Option(help="GPU_TYPE=COUNT, repeatable")] = None,
    weight: float = 1.0,
    cpus: Annotated[
        float | None, typer.Option(min=0, help="cap on the CPUs its running jobs hold")
    ] = None,
    memory_gb: Annotated[
        float | None, typer.Option(min=0, help="cap on the memory (GB) its running jobs hold")
    ] = None,
) -> None:
    """Create or update a tenant (cluster admins)."""
    body = {
        "name": name,
        "quota": _quota(quota),
        "borrow_limit": _quota(borrow),
        "weight": weight,
        "cpu_quota": cpus,
        "memory_quota_gb": memory_gb,
    }
    with readable():
        client.put(f"/v1/tenants/{name}", body)
    console.print(f"tenant {name} saved")


@users_app.command("create")
@api_command
def users_create(
    client: Client,
    name: str,
    tenant: Annotated[str | None, typer.Option(help="grant a role in this tenant")] = None,
    role: Annotated[str, typer.Option(help="viewer, member or admin")] = "member",
) -> None:
    """Create a user, optionally with a role in a tenant, and print a token for it."""
    with readable():
        client.post("/v1/users", {"name": name})
        if tenant:
            client.put(f"/v1/tenants/{tenant}/members", {"user": name, "role": role})
        issued = client.post("/v1/tokens", {"user": name, "description": "created with the user"})
    console.print(f"user {name} created; its token (shown once):\n{issued['token']}")


@tokens_app.command("create")
@api_command
def tokens_create(
    client: Client,
    user: Annotated[str | None, typer.Option(help="another user (cluster admins)")] = None,
    description: str = "",
) -> None:
    """Create a token; it is printed once and stored only as a hash."""
    with readable():
        issued = client.post("/v1/tokens", {"user": user, "description": description})
    console.print(issued["token"])


TOKEN_COLUMNS = (
    Column("id", lambda t: t["id"], whole=True),
    Column("user", lambda t: t["user"], whole=True),
    Column("created", lambda t: when(t["created_at"]), whole=True, priority=2),
    Column("description", lambda t: t["description"], priority=3, floor=12),
    Column("revoked", lambda t: when(t["revoked_at"]), whole=True, priority=1),
    Column("expires", lambda t: when(t["expires_at"]), whole=True, wide=True),
)


@tokens_app.command("list")
@api_command
def tokens_list(client: Client, output: OutputOption = Output.table) -> None:
    """Tokens you can see (ids only: a token's secret is shown once, when created)."""
    with readable():
        tokens = client.get("/v1/tokens")
    print_records(output, TOKEN_COLUMNS, tokens, empty="no tokens")


@tokens_app.command("revoke")
@api_command
def tokens_revoke(client: Client, token_id: str) -> None:
    """Revoke a token: requests bearing it are refused from now on."""
    with readable():
        client.delete(f"/v1/tokens/{token_id}")
    console.print(f"token {token_id} revoked")


NODE_COLUMNS = (
    Column("node", lambda n: n["name"], whole=True),
    Column("pod", lambda n: n["pod"], whole=True, priority=3),
    Column("rack", lambda n: n["rack"], whole=True, priority=2),
    Column("GPUs", lambda n: f"{n['gpus']} {n['gpu_type']}", whole=True, priority=1),
    Column("used", lambda n: str(n["gpus_used"]), whole=True, priority=1, justify="right"),
    Column("health", lambda n: n["health"], whole=True),
    Column("power", lambda n: n.get("power", "on"), whole=True, priority=1),
    Column("why", lambda n: n["health_reason"] or "", priority=1, floor=16),
    Column("last seen", lambda n: when(n["last_seen"]), whole=True, wide=True),
    Column("labels", lambda n: show(n["labels"]), wide=True),
)


@nodes_app.callback()
def nodes_list(
    ctx: typer.Context,
    home: HomeOption = Path("~/.aicluster"),
    url: UrlOption = None,
    token: TokenOption = None,
    ca: CaOption = None,
    output: OutputOption = Output.table,
) -> None:
    """List nodes with their topology, GPUs in use and health."""
    if ctx.invoked_subcommand is not None:  # `nodes cordon ...`: that command connects
        return
    with readable():
        nodes = client_for(home.expanduser(), url, token, ca).get("/v1/nodes")
    print_records(output, NODE_COLUMNS, nodes, empty="no nodes")


@nodes_app.command("cordon")
@api_command
def nodes_cordon(
    client: Client,
    name: str,
    reason: str = "cordoned by an operator",
) -> None:
    """Place nothing new on a node (running jobs continue)."""
    with readable():
        client.post(f"/v1/nodes/{name}/cordon", params={"reason": reason})
    console.print(f"{name} cordoned")


@nodes_app.command("drain")
@api_command
def nodes_drain(
    client: Client,
    name: str,
    reason: str = "drained by an operator",
) -> None:
    """Cordon a node and move its jobs elsewhere (they checkpoint first)."""
    with readable():
        client.post(f"/v1/nodes/{name}/drain", params={"reason": reason})
    console.print(f"{name} is draining")


@nodes_app.command("uncordon")
@api_command
def nodes_uncordon(
    client: Client,
    name: str,
) -> None:
    """Let the scheduler place jobs on a node again."""
    with readable():
        client.post(f"/v1/nodes/{name}/uncordon")
    console.print(f"{name} is schedulable again")


def register(app: typer.Typer) -> None:
    app.add_typer(tenants_app, name="tenants")
    app.add_typer(tokens_app, name="tokens")
    app.add_typer(users_app, name="users")
    app.add_typer(nodes_app, name="nodes")
