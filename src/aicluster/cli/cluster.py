"""Cluster lifecycle: ``up`` (embedded Ray + control plane), ``down``, ``status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer

from aicluster.artifacts import MAX_TENANT_BYTES, MAX_UPLOAD_BYTES
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
    log = open(home / "server.log", "ab")  # noqa: SIM115 - handed to the child process
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
    ray_address: Annotated[str | None, typer.Option(help="join this Ray cluster instead")] = None,
    power_provider: Annotated[
        Path | None,
        typer.Option(
            help="with --ray-address: the script provider's YAML file that powers nodes down "
            "and up under power saving (docs/deploy.md); the embedded cluster has its own"
        ),
    ] = None,
    db: Annotated[str | None, typer.Option(help="database URL (default SQLite in --home)")] = None,
    host: Annotated[
        str, typer.Option(help="API address (off loopback only with auth)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port")] = 8765,
    tenants: Annotated[Path | None, typer.Option(help="tenants file to load")] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="scheduler configuration file, made live at start (docs/config.md)"),
    ] = None,
    auth: Annotated[
        bool,
        typer.Option("--auth/--no-auth", help="require bearer tokens (--no-auth: loopback only)"),
    ] = True,
    max_code_upload_bytes: Annotated[
        int, typer.Option(min=1, help="cap on one code upload (aicluster submit ships code)")
    ] = MAX_UPLOAD_BYTES,
    max_code_bytes_per_tenant: Annotated[
        int, typer.Option(min=1, help="cap on the code archives one tenant stores")
    ] = MAX_TENANT_BYTES,
    job_disk_gb: Annotated[
        float,
        typer.Option(min=0.001, help="disk each job's checkpoints, export and files may take"),
    ] = 100.0,
    insecure_no_sandbox: Annotated[
        bool,
        typer.Option(
            "--insecure-no-sandbox",
            help="run jobs unsandboxed, as the control plane's user (a single trusted team only)",
        ),
    ] = False,
    max_pending_per_tenant: Annotated[
        int, typer.Option(min=0, help="jobs one tenant may have waiting (0: no cap); then 429")
    ] = 5000,
    submit_rate_per_token: Annotated[
        str, typer.Option(help="job submissions per token, e.g. '300/second;3000/minute'")
    ] = "300/second;3000/minute",
    submit_rate_per_tenant: Annotated[
        str, typer.Option(help='job submissions per tenant ("": no limit)')
    ] = "600/second;6000/minute",
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="serve the API over HTTPS with this certificate chain (PEM)"),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="the private key of --tls-cert (PEM)")
    ] = None,
    ca: Annotated[
        Path | None,
        typer.Option(
            help="the CA that signed --tls-cert (PEM), recorded for this machine's CLI "
            "(default: the system's CAs)"
        ),
    ] = None,
    home: HomeOption = Path("~/.aicluster"),
) -> None:
    """Start the control plane, and the embedded Ray cluster unless --ray-address is given.

    Jobs run in their tenant's sandbox; where this machine cannot make one, ``up`` refuses to
    start unless ``--insecure-no-sandbox`` is given. With ``--tls-cert`` and ``--tls-key`` the
    API is served over HTTPS (docs/deploy.md)."""
    from aicluster.control.settings import ServerSettings
    from aicluster.runtime import embedded_topology, start_detached
    from aicluster.runtime.rayauth import enable_token_auth, token_file
    from aicluster.runtime.sandbox import probe
    from aicluster.store.engine import make_private_dir

    try:  # refuse bad settings (--no-auth off loopback, a malformed rate) before starting Ray
        ServerSettings(
            host=host,
            port=port,
            auth=auth,
            max_pending_per_tenant=max_pending_per_tenant,
            submit_rate_per_token=submit_rate_per_token,
            submit_rate_per_tenant=submit_rate_per_tenant,
        )
    except ValueError as error:
        raise fail(str(error)) from None
    tls = _tls_files(tls_cert, tls_key, ca)
    home = home.expanduser().resolve()
    make_private_dir(home)  # 0700: the state directory, the tokens and the database are in it
    try:
        running = _server_alive(home)
    except _Untrusted:
        running = {"url": json.loads((home / "server.json").read_text())["url"]}
    if running is not None:
        console.print(f"aicluster is already up at {running['url']} (state in {home})")
        return
    embedded = ray_address is None
    if power_provider is not None:
        _check_provider(power_provider, embedded)
    if not insecure_no_sandbox and (why := probe()) is not None:
        raise fail(
            f"cannot sandbox the tenants' jobs here: {why}. Every job would run as the control "
            "plane's user and could read its state; to run so anyway (one trusted team), "
            "start with --insecure-no-sandbox"
        )
    with readable():
        if ray_address is None:
            # Ray's token authentication for the embedded nodes and the control plane (they
            # inherit it); a cluster joined with --ray-address brings its own (docs/deploy.md).
            enable_token_auth(token_file(home))
            topology = (
                None if cluster else embedded_topology(nodes=nodes, gpus_per_node=gpus_per_node)
            )
            with console.status(f"starting {nodes} Ray nodes on 127.0.0.1"):
                ray = start_detached(home, topology, cluster_file=cluster)
            ray_address = ray.address
        args = ["--host", host, "--port", str(port), "--ray-address", ray_address]
        if embedded:
            args += ["--power-provider", "embedded"]
        elif power_provider is not None:
            args += ["--power-provider", str(power_provider.resolve())]
        args += ["--db", db] if db else []
        args += ["--tenants", str(tenants.resolve())] if tenants else []
        args += ["--cluster", str(Path(cluster).resolve())] if cluster else []
        args += ["--config", str(config.resolve())] if config else []
        args += [] if auth else ["--no-auth"]
        args += ["--insecure-no-sandbox"] if insecure_no_sandbox else []
        args += ["--job-disk-gb", str(job_disk_gb)]
        args += ["--max-code-upload-bytes", str(max_code_upload_bytes)]
        args += ["--max-code-bytes-per-tenant", str(max_code_bytes_per_tenant)]
        args += tls
        args += ["--max-pending-per-tenant", str(max_pending_per_tenant)]
        args += ["--submit-rate-per-token", submit_rate_per_token]
        args += ["--submit-rate-per-tenant", submit_rate_per_tenant]
        with console.status("starting the control plane"):
            info = _wait_healthy(home, _spawn_server(home, args, embedded), timeout_s=120)
    console.print(f"aicluster is up: API {info['url']}, Ray {ray_address}")
    if (home / "admin.token").exists():
        console.print(f"the cluster admin's token is in {home / 'admin.token'} (used by this CLI)")


def _check_provider(path: Path, embedded: bool) -> None:
    """A readable error before anything starts: the server would refuse the file too."""
    import yaml

    from aicluster.runtime.providers import load_provider

    if embedded:
        raise fail("--power-provider goes with --ray-address: the embedded cluster has its own")
    try:
        load_provider(path)
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise fail(f"--power-provider: {error}") from None


def _tls_files(cert: Path | None, key: Path | None, ca: Path | None) -> list[str]:
    """The server's TLS arguments; both files or neither, each a readable file."""
    if (cert is None) != (key is None):
        raise fail("give both --tls-cert and --tls-key (or neither, for plain HTTP)", 2)
    if cert is None and ca is not None:
        raise fail("--ca names the CA of --tls-cert: give --tls-cert and --tls-key too", 2)
    args: list[str] = []
    for flag, path in (("--tls-cert", cert), ("--tls-key", key), ("--ca", ca)):
        if path is None:
            continue
        if not path.expanduser().is_file():
            raise fail(f"{flag} {path}: no such file", 2)
        args += [flag, str(path.expanduser().resolve())]
    if ca is not None:
        try:
            tls_context(ca.expanduser())
        except ApiError as error:
            raise fail(str(error), 2) from None
    return args


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
        console.print(f"jobs sandboxed per tenant · limits: {health.get('resource_limits')}")
    capacity = [(t, n, summary["used"].get(t, 0)) for t, n in summary["capacity"].items()]
    print_records(output, CAPACITY_COLUMNS, capacity)
    if summary["used_by_tenant"]:
        console.print()
        print_records(output, USAGE_COLUMNS, list(summary["used_by_tenant"].items()))


def register(app: typer.Typer) -> None:
    for command in (up, down, status):
        app.command()(command)
