"""``aicluster sim``: replay a trace on a simulated cluster under one or more policies."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from aicluster.core import Cluster, ConfigError, Tenant, make_cluster, parse_cluster, parse_tenants
from aicluster.scheduler import SchedulerConfig, names
from aicluster.sim import (
    PHILLY,
    SimConfig,
    SimResult,
    Simulator,
    TraceJob,
    load_trace,
    synthetic_jobs,
)

__all__ = ["sim_command"]

SYNTHETIC = "synthetic"


class UsageError(ValueError):
    """A command-line input is wrong: printed as one line, exit code 2."""


def sim_command(
    trace: str = typer.Option(
        PHILLY, help="'philly' (packaged trace), 'synthetic' (seeded), or a CSV file."
    ),
    cluster: Path | None = typer.Option(None, help="Cluster YAML file (default: --nodes)."),
    nodes: int = typer.Option(64, help="Generate a cluster of this many nodes (no --cluster)."),
    gpus_per_node: int = typer.Option(8, help="GPUs per generated node."),
    tenants: Path | None = typer.Option(None, help="Tenants YAML file (quotas, weights)."),
    policy: str = typer.Option("tiresias", help=f"Queue policy: {', '.join(names())}."),
    compare: str | None = typer.Option(None, help="Comma-separated policies to compare."),
    backfill: str = typer.Option("easy", help="Backfill: easy or none."),
    seed: int = typer.Option(0, help="Seed for failures and the synthetic trace."),
    limit: int | None = typer.Option(None, min=1, help="Replay only the first N jobs."),
    failures: bool = typer.Option(True, help="Simulate node failures (Llama 3 MTBF)."),
    cycle_interval: float = typer.Option(0.0, min=0, help="Seconds between cycles (0: events)."),
    checkpoint_interval: float = typer.Option(1800.0, min=1, help="Seconds between checkpoints."),
    days: float = typer.Option(7.0, min=0.01, help="Synthetic trace: days of arrivals."),
    load: float = typer.Option(0.7, min=0.01, help="Synthetic trace: offered load."),
    out: Path = typer.Option(Path("reports/sim"), help="Output directory."),
    report: bool = typer.Option(True, help="Write PNG plots and report.html."),
) -> None:
    """Replay a trace on a simulated cluster; compare policies; write JSON, CSV and a report."""
    console = Console()
    try:
        the_cluster = _load_cluster(cluster, nodes, gpus_per_node)
        the_tenants = _load_tenants(tenants)
        policies = _policies(policy, compare)
        scheduler = SchedulerConfig(backfill=backfill)
        jobs = _load_jobs(trace, limit)
    except (ConfigError, UsageError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    config = SimConfig(
        checkpoint_interval=checkpoint_interval,
        failures=failures,
        cycle_interval=cycle_interval,
        seed=seed,
    )
    horizon = days * 86_400.0
    results: list[SimResult] = []
    with _progress(console) as progress:
        for name in policies:
            trace_jobs: Iterable[TraceJob] = (
                jobs
                if jobs is not None
                else _synthetic(seed, the_cluster.total_gpus, load, horizon, limit)
            )
            task = progress.add_task(name, total=len(jobs) if jobs is not None else horizon)

            def update(now: float, arrived: int, done: int, task: Any = task) -> None:
                progress.update(task, completed=done if jobs is not None else min(now, horizon))

            simulator = Simulator(
                the_cluster,
                trace_jobs,
                policy=name,
                tenants=the_tenants,
                scheduler=scheduler,
                config=config,
                progress=update,
            )
            results.append(simulator.run())
    _finish(console, results, out, report)


def _finish(console: Console, results: list[SimResult], out: Path, report: bool) -> None:
    from aicluster.sim.output import write_results

    summaries = write_results(results, out)
    console.print(_table(summaries))
    if report:
        from aicluster.sim.report import write_report

        page = write_report(results, summaries, out)
        console.print(f"report: {page}")
    console.print(f"results: {out}/summary.json, summary.csv, jobs-*.csv, series-*.csv")


def _table(summaries: list[dict[str, Any]]) -> Table:
    from aicluster.sim.output import TERMINAL_COLUMNS, comparison_rows

    first = summaries[0]
    title = f"{first['cluster']}: {first['gpus']:,} GPUs, {first['jobs']:,} jobs"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for label, _, _ in TERMINAL_COLUMNS:
        if label == "policy":
            table.add_column(label, no_wrap=True)
        else:
            table.add_column(label, justify="right", min_width=len(label))
    for row in comparison_rows(summaries, TERMINAL_COLUMNS):
        table.add_row(*row)
    return table


def _progress(console: Console) -> Progress:
    """A progress bar per policy (jobs finished, or simulated time); hidden when not a TTY."""
    return Progress(
        TextColumn("{task.description:>10}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )


def _load_cluster(path: Path | None, nodes: int, gpus_per_node: int) -> Cluster:
    if path is None:
        if nodes < 1 or gpus_per_node < 1:
            raise UsageError("--nodes and --gpus-per-node must be at least 1")
        return make_cluster(nodes=nodes, gpus_per_node=gpus_per_node)
    return parse_cluster(_read(path, "cluster"), str(path))


def _load_tenants(path: Path | None) -> dict[str, Tenant]:
    return {} if path is None else parse_tenants(_read(path, "tenants"), str(path))


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"{path}: cannot read the {what} file ({error.strerror})") from None


def _policies(policy: str, compare: str | None) -> list[str]:
    chosen = [name.strip() for name in (compare or policy).split(",") if name.strip()]
    unknown = [name for name in chosen if name not in names()]
    if unknown or not chosen:
        raise UsageError(
            f"unknown policy {', '.join(unknown) or '(none)'} (known: {', '.join(names())})"
        )
    return list(dict.fromkeys(chosen))


def _load_jobs(trace: str, limit: int | None) -> list[TraceJob] | None:
    """The trace's jobs, or None for the synthetic trace (generated per run, streamed)."""
    if trace == SYNTHETIC:
        return None
    jobs = load_trace(trace)
    return jobs[:limit] if limit is not None else jobs


def _synthetic(
    seed: int, total_gpus: int, load: float, horizon: float, limit: int | None
) -> Iterator[TraceJob]:
    jobs = synthetic_jobs(
        random.Random(f"trace:{seed}"), total_gpus=total_gpus, load=load, horizon=horizon
    )
    for count, job in enumerate(jobs):
        if limit is not None and count >= limit:
            return
        yield job
