"""Entry point of the ``aicluster`` command."""

from __future__ import annotations

import typer

from aicluster import __version__
from aicluster.cli.sim import sim_command

app = typer.Typer(
    name="aicluster",
    help="Many GPU machines as one AI supercomputer: schedule, simulate, run and serve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

app.command("sim")(sim_command)


@app.command()
def version() -> None:
    """Print the aicluster version."""
    typer.echo(__version__)


def main() -> None:  # pragma: no cover - console entry point
    app()
