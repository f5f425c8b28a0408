"""``aicluster twin``: the live cluster as a twin the simulator replays."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from aicluster.cli.audit import parse_time
from aicluster.cli.common import Client, api_command, fail, readable
from aicluster.cli.output import stdout_console

__all__ = ["register"]

twin_app = typer.Typer(
    help="The live cluster as a twin: export its history for `aicluster sim` (docs/twin.md).",
    no_args_is_help=True,
)

#: What `twin export` writes into --out, from the server's answer.
FILES = {"trace.csv": "trace_csv", "cluster.yaml": "cluster_yaml", "config.yaml": "config_yaml"}
#: The live cost of preemption of the exported jobs, per tenant, beside them (JSON).
COST_FILE = "preemption-cost.json"


@twin_app.command("export")
@api_command
def export(
    client: Client,
    out: Annotated[Path, typer.Option(help="folder to write trace.csv, cluster.yaml, config.yaml")],
    since: Annotated[
        str | None, typer.Option(help="jobs submitted from: a duration ago (2d) or an ISO time")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="jobs submitted before: a duration ago or an ISO time")
    ] = None,
) -> None:
    """Write the live history (jobs that ran and ended), the nodes and the configuration in
    force into OUT; `aicluster sim --trace OUT/trace.csv --cluster OUT/cluster.yaml --config
    OUT/config.yaml` replays it (cluster admins)."""
    params = {
        "since": parse_time(since, "--since") if since else None,
        "until": parse_time(until, "--until") if until else None,
    }
    with readable():
        twin = client.get("/v1/twin/export", **params)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, key in FILES.items():
            (out / name).write_text(twin[key], encoding="utf-8")
        cost = json.dumps(twin.get("preemption_cost", {}), indent=2) + "\n"
        (out / COST_FILE).write_text(cost, encoding="utf-8")
    except OSError as error:
        raise fail(f"{out}: cannot write the twin ({error.strerror})") from None
    stdout_console().print(
        f"{twin['jobs']} jobs -> {out}/trace.csv; cluster.yaml, config.yaml and "
        f"{COST_FILE} (the live cost of preemption) beside it\n"
        f"replay: aicluster sim --trace {out}/trace.csv --cluster {out}/cluster.yaml "
        f"--config {out}/config.yaml",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(twin_app, name="twin")
