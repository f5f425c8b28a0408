"""Entry point of the ``aicluster`` command."""

from __future__ import annotations

import typer

from aicluster import __version__
from aicluster.cli import (
    admin,
    audit,
    cluster,
    config,
    data,
    jobs,
    models,
    pipelines,
    rollouts,
    serving,
    usage,
)
from aicluster.cli.plan import plan_command
from aicluster.cli.sim import sim_command
from aicluster.cli.twin import register as register_twin

app = typer.Typer(
    name="aicluster",
    help="Many GPU machines as one AI supercomputer: schedule, simulate, run and serve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help: at 80 columns it wraps; Typer's Rich panels cut long option names.
    rich_markup_mode=None,
)

app.command("sim")(sim_command)
app.command("plan")(plan_command)


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
audit.register(app)
usage.register(app)
config.register(app)
data.register(app)
pipelines.register(app)
register_twin(app)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # python -m aicluster.cli.main
    main()
