"""``aicluster plan``: the smallest cluster grown from a template that meets every SLO on a
trace's replay (the capacity planner, aicluster.sim.plan)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import typer
from rich.table import Table

from aicluster.cli.output import stdout_console
from aicluster.cli.sim import UsageError, _load_configuration, _policies, _read
from aicluster.configuration import prediction_options, scheduler_config, sim_config
from aicluster.core import ConfigError, parse_cluster
from aicluster.scheduler import names
from aicluster.sim import load_trace
from aicluster.sim.plan import Plan, PlanSetup, Trial, run_plan
from aicluster.sim.plan_report import answer_line, write_report
from aicluster.sim.plan_spec import Grid, PlanError, parse_slo, parse_vary

__all__ = ["plan_command"]


def plan_command(
    trace: str = typer.Option(..., help="'philly' (packaged trace) or a CSV file."),
    cluster_template: Path = typer.Option(
        ..., help="Cluster YAML whose nodes (and racks) are repeated to each size tried."
    ),
    slo: list[str] = typer.Option(
        ..., help="An objective, e.g. 'p95_wait<=1h', 'p99_jct<=2d', 'utilization>=60%' (repeat)."
    ),
    vary: list[str] = typer.Option(
        ...,
        help="nodes=LOW..HIGH[:STEP] (required; step 1 by default), gpu_type=A100,H100, "
        "racks=4,8 or racks=2..8 (repeat the option).",
    ),
    config_file: Path | None = typer.Option(
        None, "--config", help="Scheduler configuration file (docs/config.md)."
    ),
    policy: str | None = typer.Option(
        None, help=f"Queue policy: {', '.join(names())} (default: the configuration's)."
    ),
    workers: int = typer.Option(
        min(4, os.cpu_count() or 1), min=1, help="Replays at once, each in its own process."
    ),
    ray_address: str | None = typer.Option(
        None,
        help="Run the replays as tasks on this Ray cluster (host:port, or 'auto'), --workers "
        "at once, instead of in processes here.",
    ),
    limit: int | None = typer.Option(None, min=1, help="Replay only the first N jobs."),
    seed: int = typer.Option(0, help="Seed for failures."),
    failures: bool | None = typer.Option(
        None, "--failures/--no-failures", help="Simulate node failures (default: the config's)."
    ),
    out: Path = typer.Option(Path("reports/plan"), help="Report folder."),
) -> None:
    """Find the smallest cluster that meets every SLO: replay TRACE on the template grown to
    the sizes of --vary nodes, searching (not sweeping) since the metrics are assumed monotone
    in size; print what was tried and the answer; write plan.csv, plan.json, plan.svg."""
    console = stdout_console()
    try:
        slos = [parse_slo(text) for text in slo]
        grid = parse_vary(vary)
        configuration, tenants = _load_configuration(config_file)
        template = parse_cluster(_read(cluster_template, "cluster"), str(cluster_template))
        chosen = _policies(policy or configuration.policy.name, None)[0]
        jobs = load_trace(trace)[:limit]
        if not jobs:
            raise UsageError(f"{trace}: the trace has no jobs")
        setup = PlanSetup(
            template,
            jobs,
            replace(scheduler_config(configuration, explain=False), queue=chosen),
            sim_config(configuration, seed=seed, failures=failures),
            slos,
            tenants,
            prediction_options(configuration),
        )
    except (ConfigError, PlanError, UsageError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2) from None
    try:
        plan = run_plan(setup, grid, workers, ray_address)
    except ConnectionError as error:  # Ray's, for an address where no cluster answers
        typer.echo(f"error: --ray-address {ray_address}: {error}", err=True)
        raise typer.Exit(2) from None
    console.print(_table(plan, grid))
    for variant in plan.variants:
        console.print(answer_line(variant), highlight=False, markup=False)
    try:
        written = write_report(plan, template, out)
    except OSError as error:
        typer.echo(f"error: {out}: cannot write the report ({error.strerror})", err=True)
        raise typer.Exit(1) from None
    console.print(f"report: {', '.join(map(str, written))}; clusters: {out}/clusters/")
    if not any(variant.answer is not None for variant in plan.variants):
        raise typer.Exit(1)


def _table(plan: Plan, grid: Grid) -> Table:
    table = Table(title="replays tried (sizes in nodes)")
    varied = [
        name
        for name, values in (("gpu_type", grid.gpu_types), ("racks", grid.racks))
        if values != (None,)
    ]
    for name in [*varied, "nodes", "GPUs", *(slo.text for slo in plan.slos), "met"]:
        table.add_column(name, justify="right")
    for variant in plan.variants:
        labels = {"gpu_type": variant.gpu_type, "racks": variant.racks}
        for trial in variant.trials.values():
            cells = [str(labels[name]) for name in varied]
            cells += [str(trial.nodes), f"{trial.gpus:,}"]
            for slo, ok in zip(plan.slos, trial.met, strict=True):
                shown = slo.show(trial.figures.get(slo.key, float("nan")))
                cells.append(f"{shown} {'ok' if ok else 'miss'}")
            unfinished = int(trial.figures.get("unfinished", 0))
            cells.append(
                "yes"
                if trial.all_met
                else f"no ({unfinished:,} unfinished)"
                if unfinished
                else "no"
            )
            table.add_row(*cells)
    return table


def _met_cell(trial: Trial) -> str:
    unfinished = int(trial.figures.get("unfinished", 0))
    if trial.all_met:
        return "yes"
    return f"no ({unfinished:,} unfinished)" if unfinished else "no"
