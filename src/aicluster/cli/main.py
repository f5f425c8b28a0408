"""Entry point of the ``aicluster`` command."""

from __future__ import annotations

import typer

from aicluster import __version__
from aicluster.cli import admin, cluster, jobs, models, rollouts, serving
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


cluster.register(app)
jobs.register(app)
models.register(app)
admin.register(app)
serving.register(app)
rollouts.register(app)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # python -m aicluster.cli.main
    main()
