"""``aicluster sim``: replay a trace on a simulated cluster under one or more policies."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from aicluster.cli.output import Column, Output, fit_table, print_data, print_table, stdout_console
from aicluster.configuration import (
    Configuration,
    parse_configuration,
    prediction_options,
    scheduler_config,
    sim_config,
)
from aicluster.core import Cluster, ConfigError, Tenant, make_cluster, parse_cluster, parse_tenants
from aicluster.scheduler import names
from aicluster.sim import (
    PHILLY,
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
    config_file: Path | None = typer.Option(
        None,
        "--config",
        help="Scheduler configuration file, as `aicluster up --config` reads it (docs/config.md); "
        "the options below override it.",
    ),
    policy: str | None = typer.Option(
        None, help=f"Queue policy: {', '.join(names())} (default: the configuration's)."
    ),
    compare: str | None = typer.Option(None, help="Comma-separated policies to compare."),
    backfill: str | None = typer.Option(None, help="Backfill: easy or none."),
    placement: str | None = typer.Option(
        None, help="Placement strategy: topology or random (default: the configuration's)."
    ),
    seed: int = typer.Option(0, help="Seed for failures and the synthetic trace."),
    limit: int | None = typer.Option(None, min=1, help="Replay only the first N jobs."),
    failures: bool | None = typer.Option(
        None, "--failures/--no-failures", help="Simulate node failures (Llama 3 MTBF)."
    ),
    cycle_interval: float | None = typer.Option(
        None, min=0, help="Seconds between cycles (0: events)."
    ),
    checkpoint_interval: float | None = typer.Option(
        None, min=1, help="Seconds between checkpoints."
    ),
    days: float = typer.Option(7.0, min=0.01, help="Synthetic trace: days of arrivals."),
    load: float = typer.Option(0.7, min=0.01, help="Synthetic trace: offered load."),
    out: Path = typer.Option(Path("reports/sim"), help="Output directory."),
    report: bool = typer.Option(True, help="Write PNG plots and report.html."),
    output: Output = typer.Option(
        Output.table,
        "--output",
        "-o",
        case_sensitive=False,
        help="table (fits the terminal), wide (every column), json or yaml (summary.json)",
    ),
) -> None:
    """Replay a trace on a simulated cluster; compare policies; write JSON, CSV and a report."""
    # With -o json/yaml stdout is the document alone: the rest goes to stderr.
    structured = output in (Output.json, Output.yaml)
    console = Console(stderr=True) if structured else stdout_console()
    try:
        configuration, seeded = _load_configuration(config_file)
        the_cluster = _load_cluster(cluster, nodes, gpus_per_node)
        the_tenants = _load_tenants(tenants) if tenants is not None else seeded
        policies = _policies(policy or configuration.policy.name, compare)
        scheduler = scheduler_config(configuration, explain=False)
        if backfill is not None:
            scheduler = replace(scheduler, backfill=backfill)
        if placement is not None:
            scheduler = replace(scheduler, placement=placement)
        jobs = _load_jobs(trace, limit)
        config = sim_config(
            configuration,
            checkpoint_interval=checkpoint_interval,
            failures=failures,
            cycle_interval=cycle_interval,
            seed=seed,
        )
    except (ConfigError, UsageError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    horizon = days * 86_400.0
    options = prediction_options(configuration)  # a fresh predictor per run where on
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
                tenants=the_tenants,
                scheduler=replace(scheduler, queue=name),
                config=config,
                predictor=options.predictor() if options is not None else None,
            )
            results.append(simulator.run(update))
    _finish(console, results, out, report, output)


def _finish(
    console: Console,
    results: list[SimResult],
    out: Path,
    report: bool,
    output: Output = Output.table,
) -> None:
    from aicluster.sim.output import write_results

    summaries = write_results(results, out)
    if output in (Output.json, Output.yaml):  # the document as written (NaN as null)
        print_data(output, json.loads((out / "summary.json").read_text()))
    else:
        print_table(_table(summaries, console.width, wide=output is Output.wide), console)
    if report:
        from aicluster.sim.report import write_report

        page = write_report(results, summaries, out)
        console.print(f"report: {page}")
    console.print(
        f"results: {out}/summary.json, summary.csv, preemption-cost.csv, jobs-*.csv, series-*.csv"
    )


#: Which comparison columns go first when the terminal is narrow (1 last; 0 never). Those the
#: terminal never showed (sim.output.TERMINAL_COLUMNS) show with -o wide.
_PRIORITY = {"policy": 0, "done": 1, "JCT h": 1, "wait h": 1, "util": 1, "goodput": 1}
_PRIORITY |= {"p95 h": 2, "slowdown": 2, "Jain": 2, "p99 h": 3, "preempt": 3, "lost GPUh": 3}
_PRIORITY |= {"pre-lost GPUh": 3, "evict/GPUh": 3}


def _table(summaries: list[dict[str, Any]], width: int, wide: bool = False) -> tuple[Table, int]:
    """The policies side by side, fitted to ``width`` (every column with ``wide``)."""
    from aicluster.sim.output import COMPARISON, TERMINAL_COLUMNS

    first = summaries[0]
    title = f"{first['cluster']}: {first['gpus']:,} GPUs, {first['jobs']:,} jobs"
    columns = [
        Column(
            label,
            _cell(key, render),
            whole=True,
            priority=_PRIORITY.get(label, 4),
            wide=(label, key, render) not in TERMINAL_COLUMNS,
            justify="left" if label == "policy" else "right",
        )
        for label, key, render in COMPARISON
    ]
    return fit_table(columns, summaries, width, wide=wide, title=title)


def _cell(key: str, render: Callable[[Any], str]) -> Callable[[dict[str, Any]], str]:
    return lambda summary: render(summary[key])


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


def _load_configuration(path: Path | None) -> tuple[Configuration, dict[str, Tenant]]:
    """The configuration file's settings and seeded tenants (none: the documented defaults)."""
    if path is None:
        return Configuration(), {}
    return parse_configuration(_read(path, "configuration"), str(path))


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
