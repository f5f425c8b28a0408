"""Cluster lifecycle: ``up`` (embedded Ray + control plane), ``down``, ``status``."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from aicluster.cli.client import ApiError, tls_context
from aicluster.cli.common import (
    Client,
    HomeOption,
    api_command,
    console,
    fail,
    readable,
)
from aicluster.cli.output import Column, Output, OutputOption, print_data, print_records

__all__ = ["register"]


class _Untrusted(Exception):
    """The server answers HTTPS with a certificate this machine does not trust."""


def _server_alive(home: Path) -> dict[str, object] | None:
    """The running server recorded in ``home/server.json``, if it answers (over HTTPS checked
    against the CA recorded there, else the system's CAs). Raises :class:`_Untrusted` when
    its certificate does not verify."""
    try:
        info = json.loads((home / "server.json").read_text())
        os.kill(int(info["pid"]), 0)
        verify = tls_context(info.get("ca"))
        httpx.get(f"{info['url']}/healthz", timeout=2, verify=verify).raise_for_status()
    except httpx.ConnectError as error:
        if "CERTIFICATE_VERIFY_FAILED" in str(error):
            raise _Untrusted(str(error)) from None
        return None
    except (OSError, ValueError, KeyError, httpx.HTTPError, ApiError):
        return None
    return dict(info)


def _spawn_server(home: Path, args: list[str], embedded: bool) -> subprocess.Popen[bytes]:
    from aicluster.artifacts.private import open_private

    log = open_private(home / "server.log")  # handed to the child process
    command = [sys.executable, "-m", "aicluster.server", "--state-dir", str(home), *args]
    env = dict(os.environ)
    if embedded:  # Ray reads this at import: the driver binds loopback like the embedded nodes
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )


def _wait_healthy(
    home: Path, process: subprocess.Popen[bytes], timeout_s: float
) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            info = _server_alive(home)
        except _Untrusted as error:
            _stop_spawned(home, process)
            raise fail(
                f"the control plane serves HTTPS, but its certificate does not verify here "
                f"({error}); it was stopped. Give the CA that signed --tls-cert with --ca FILE "
                "(for a self-signed certificate: the certificate itself)"
            ) from None
        if info is not None and info.get("pid") == process.pid:
            return info
        time.sleep(0.3)
    tail = (home / "server.log").read_text(errors="replace")[-2000:]
    raise fail(f"the control plane did not come up; end of {home / 'server.log'}:\n{tail}")


def _stop_spawned(home: Path, process: subprocess.Popen[bytes]) -> None:
    """Stop the server this call started, and forget it: a later ``up`` must not find it."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
    (home / "server.json").unlink(missing_ok=True)


def up(
    nodes: Annotated[int, typer.Option(help="Ray nodes of the embedded cluster")] = 4,
    gpus_per_node: Annotated[int, typer.Option(help="(simulated) GPUs per node")] = 8,
    cluster: Annotated[
        Path | None, typer.Option(help="cluster YAML for the embedded nodes")
    ] = None,
    power_provider: Annotated[
        Path | None,
        typer.Option(
            help="with --ray-address: the script provider's YAML file that powers nodes down "
            "and up under power saving (docs/deploy.md); the embedded cluster has its own"
        ),
    ] = None,
    tenants: Annotated[Path | None, typer.Option(help="tenants file to load")] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="scheduler configuration file, made live at start (docs/config.md)"),
    ] = None,
    ca: Annotated[
        Path | None,
        typer.Option(
            help="the CA that signed --tls-cert (PEM), recorded for this machine's CLI "
            "(default: the system's CAs)"
        ),
    ] = None,
    home: HomeOption = Path("~/.aicluster"),
    **server: Any,
) -> None:
    """Start the control plane, and the embedded Ray cluster unless --ray-address is given.

    Jobs run in their tenant's sandbox; where this machine cannot make one, ``up`` refuses to
    start unless ``--insecure-no-sandbox`` is given. With ``--tls-cert`` and ``--tls-key`` the
    API is served over HTTPS (docs/deploy.md)."""
    from aicluster.artifacts.private import private_dir
    from aicluster.control.serveroptions import settings_from, to_argv
    from aicluster.runtime import embedded_topology, start_detached
    from aicluster.runtime.cluster.rayauth import enable_token_auth, token_file
    from aicluster.runtime.sandbox.bwrap import probe

    _check_tls(server["tls_cert"], server["tls_key"], ca)
    try:  # refuse bad settings (--no-auth off loopback, a malformed rate) before starting Ray
        settings = settings_from(server)
    except ValueError as error:
        raise fail(str(error)) from None
    home = home.expanduser().resolve()
    private_dir(home)  # 0700: the state directory, the tokens and the database are in it
    try:
        running = _server_alive(home)
    except _Untrusted:
        running = {"url": json.loads((home / "server.json").read_text())["url"]}
    if running is not None:
        console.print(f"aicluster is already up at {running['url']} (state in {home})")
        return
    embedded = settings.ray_address is None
    if power_provider is not None:
        _check_provider(power_provider, embedded)
    if settings.sandbox and (why := probe()) is not None:
        raise fail(
            f"cannot sandbox the tenants' jobs here: {why}. Every job would run as the control "
            "plane's user and could read its state; to run so anyway (one trusted team), "
            "start with --insecure-no-sandbox"
        )
    with readable():
        if embedded:
            # Ray's token authentication for the embedded nodes and the control plane (they
            # inherit it); a cluster joined with --ray-address brings its own (docs/deploy.md).
            enable_token_auth(token_file(home))
            topology = (
                None if cluster else embedded_topology(nodes=nodes, gpus_per_node=gpus_per_node)
            )
            with console.status(f"starting {nodes} Ray nodes on 127.0.0.1"):
                ray = start_detached(home, topology, cluster_file=cluster)
            settings = dataclasses.replace(settings, ray_address=ray.address)
        args = to_argv(settings)  # the server's flags, made from the same settings
        if embedded:
            args += ["--power-provider", "embedded"]
        elif power_provider is not None:
            args += ["--power-provider", str(power_provider.resolve())]
        args += ["--tenants", str(tenants.resolve())] if tenants else []
        args += ["--cluster", str(Path(cluster).resolve())] if cluster else []
        args += ["--config", str(config.resolve())] if config else []
        args += ["--ca", str(ca.expanduser().resolve())] if ca else []
        with console.status("starting the control plane"):
            info = _wait_healthy(home, _spawn_server(home, args, embedded), timeout_s=120)
    console.print(f"aicluster is up: API {info['url']}, Ray {settings.ray_address}")
    if (home / "admin.token").exists():
        console.print(f"the cluster admin's token is in {home / 'admin.token'} (used by this CLI)")


def _server_option_parameters() -> list[inspect.Parameter]:
    """``up``'s options for the server's settings, made from them
    (``control/serveroptions.py``): a setting's flag, help, type and default are written once."""
    from aicluster.control.serveroptions import server_options

    parameters = []
    for option in server_options():
        kind: Any = option.kind if option.default is not None else option.kind | None
        name, default, flags = option.dest, option.default, option.flag
        if option.pair:  # --auth / --no-auth: the field itself
            name, flags = option.name, f"{option.pair}/{option.flag}"
        elif option.negates:  # --insecure-no-sandbox: one flag, off unless given
            default = False
        shown = not (option.negates and not option.pair)  # a lone flag's default says nothing
        info = typer.Option(flags, help=option.help, show_default=shown, min=option.minimum)
        keyword = inspect.Parameter.KEYWORD_ONLY
        annotation = Annotated[kind, info]
        parameters.append(inspect.Parameter(name, keyword, default=default, annotation=annotation))
    return parameters


def _with_server_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` whose ``**server`` stands for the server's options, as Typer reads them."""
    signature = inspect.signature(command, eval_str=True)  # Annotated[...], not strings
    params = signature.parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        return command  # done already (a second app registering the commands)
    keyword = [p.replace(kind=p.KEYWORD_ONLY) for p in params if p.kind is not p.VAR_KEYWORD]
    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*keyword, *_server_option_parameters()]
    )
    return command


def _check_tls(cert: Path | None, key: Path | None, ca: Path | None) -> None:
    """Both files or neither, each a readable file, and a CA that loads."""
    if (cert is None) != (key is None):
        raise fail("give both --tls-cert and --tls-key (or neither, for plain HTTP)", 2)
    if cert is None and ca is not None:
        raise fail("--ca names the CA of --tls-cert: give --tls-cert and --tls-key too", 2)
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--ca", ca)):
        if path is not None and not path.expanduser().is_file():
            raise fail(f"{flag} {path}: no such file", 2)
    if ca is not None:
        try:
            tls_context(ca.expanduser())
        except ApiError as error:
            raise fail(str(error), 2) from None


def _check_provider(path: Path, embedded: bool) -> None:
    """A readable error before anything starts: the server would refuse the file too."""
    import yaml

    from aicluster.runtime.cluster.providers import load_provider

    if embedded:
        raise fail("--power-provider goes with --ray-address: the embedded cluster has its own")
    try:
        load_provider(path)
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise fail(f"--power-provider: {error}") from None


def down(home: HomeOption = Path("~/.aicluster")) -> None:
    """Stop the control plane and the embedded Ray cluster (jobs' state stays in the store)."""
    from aicluster.runtime import stop_detached

    home = home.expanduser().resolve()
    stopped = []
    try:
        info = json.loads((home / "server.json").read_text())
        os.kill(int(info["pid"]), signal.SIGTERM)
        _wait_gone(int(info["pid"]), 30)
        stopped.append("control plane")
    except (OSError, ValueError, KeyError):
        pass
    if stop_detached(home):
        stopped.append("Ray cluster")
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def _wait_gone(pid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)


CAPACITY_COLUMNS = (
    Column("GPU type", lambda row: row[0], whole=True),
    Column("capacity", lambda row: str(row[1]), whole=True, justify="right"),
    Column("in use", lambda row: str(row[2]), whole=True, justify="right"),
)
USAGE_COLUMNS = (
    Column("tenant", lambda row: row[0], whole=True),
    Column("GPUs in use", lambda row: ", ".join(f"{n} {t}" for t, n in row[1].items())),
)

#: The cost of preemption per tenant (``preemption_cost`` of ``GET /v1/cluster``).
PREEMPTION_COLUMNS = (
    Column("tenant", lambda row: row[0], whole=True),
    Column("preemptions", lambda row: str(row[1]["preemptions"]), whole=True, justify="right"),
    Column(
        "by kind",
        lambda row: ", ".join(f"{n} {kind}" for kind, n in row[1]["by_kind"].items()) or "-",
    ),
    Column("lost GPU-h", lambda row: f"{row[1]['lost_gpu_hours']:,.2f}", justify="right"),
    Column("admitted GPU-h", lambda row: f"{row[1]['admitted_gpu_hours']:,.1f}", justify="right"),
    Column(
        "evictions/GPU-h", lambda row: f"{row[1]['evictions_per_gpu_hour']:.4f}", justify="right"
    ),
)


@api_command
def status(client: Client, output: OutputOption = Output.table) -> None:
    """Capacity, use per tenant, nodes and jobs at a glance."""
    with readable():
        summary = client.get("/v1/cluster")
        health = client.get("/healthz")
    if print_data(output, {"cluster": summary, "health": health}):
        return
    console.print(
        f"[bold]{summary['healthy_nodes']}/{summary['nodes']}[/] nodes healthy · "
        f"leader: {'yes' if health['leader'] else 'no'} · "
        f"{summary['running_jobs']} running, {summary['pending_jobs']} pending"
    )
    if not health.get("sandboxed", False):
        console.print(
            "[bold red]UNSANDBOXED[/]: jobs run as the control plane's own user "
            "(started with --insecure-no-sandbox)"
        )
    else:
        limits, disk = health.get("resource_limits"), health.get("disk_limit")
        console.print(f"jobs sandboxed per tenant · limits: {limits} · disk cap: {disk}")
    capacity = [(t, n, summary["used"].get(t, 0)) for t, n in summary["capacity"].items()]
    print_records(output, CAPACITY_COLUMNS, capacity)
    if summary["used_by_tenant"]:
        console.print()
        print_records(output, USAGE_COLUMNS, list(summary["used_by_tenant"].items()))
    costs = summary.get("preemption_cost") or {}
    if costs:
        console.print()
        rows = list(costs.items())
        print_records(output, PREEMPTION_COLUMNS, rows, title="cost of preemption")


def register(app: typer.Typer) -> None:
    for command in (_with_server_options(up), down, status):
        app.command()(command)
