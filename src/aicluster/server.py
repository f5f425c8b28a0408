"""Run one control-plane server: the API, and the control loop while it holds the lease.

``python -m aicluster.server --state-dir DIR [--db URL] [--ray-address ADDR]`` is what
``aicluster up`` starts in the background; operators may run it under systemd instead.
It sits above both the control plane and the API, which it joins (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
import yaml

from aicluster.api.app import create_app
from aicluster.artifacts.private import private_dir, write_private
from aicluster.configuration import parse_configuration
from aicluster.control.loop.loop import ControlLoop
from aicluster.control.plane import ControlPlane
from aicluster.control.serveroptions import add_arguments, settings_from
from aicluster.control.settings import InsecureBinding, LoopSettings, ServerSettings, is_loopback
from aicluster.core import Cluster, ConfigError, parse_cluster, parse_tenants
from aicluster.store import Conflict, Store
from aicluster.store.base import WallClock

if TYPE_CHECKING:
    from aicluster.runtime.cluster.providers import NodeProvider

__all__ = ["apply_config_file", "build_plane", "main", "write_admin_token"]

log = logging.getLogger("aicluster.server")


def write_admin_token(store: Store, state_dir: Path) -> Path | None:
    """On a new store, create the cluster admin and save its token (mode 0600) for local use."""
    issued = store.bootstrap_admin()
    if issued is None:
        return None
    path = state_dir / "admin.token"
    write_private(path, issued.token + "\n")
    return path


def load_tenants(store: Store, path: Path) -> None:
    """Create or update the tenants listed in a tenants file (idempotent)."""
    for tenant in parse_tenants(path.read_text(), str(path)).values():
        try:
            store.create_tenant(tenant, "bootstrap")
        except Conflict:
            store.put_tenant(tenant, "bootstrap")


def apply_config_file(store: Store, path: Path) -> None:
    """Make a configuration file live (``up --config``): validated first, recorded only when
    it differs from the live one; its ``tenants`` section creates the tenants that are missing
    (existing ones keep what ``tenants set`` gave them)."""
    text = path.read_text()
    _, tenants = parse_configuration(text, str(path))
    store.apply_config(text, str(path), "bootstrap")
    for tenant in tenants.values():
        with contextlib.suppress(Conflict):
            store.create_tenant(tenant, "bootstrap")


def build_plane(
    settings: ServerSettings,
    *,
    interval_s: float = 1.0,
    cluster: Cluster | None = None,
    provider: NodeProvider | None = None,
) -> ControlPlane:
    """Open the store and, with a Ray address, the runtime; the loop starts when leading. The
    ``provider`` powers nodes down and up under power saving (none: every node stays on)."""
    private_dir(settings.state_dir)  # 0700: its files are the control plane's alone
    clock = WallClock()
    store = Store.open(
        settings.db_url or settings.state_dir, clock=clock, state_dir=settings.state_dir
    )
    runtime = discover = None
    if settings.ray_address is not None:
        from aicluster.runtime import Runtime, connect
        from aicluster.runtime import discover as discover_nodes
        from aicluster.runtime.sandbox.bwrap import SandboxConfig

        connect(settings.ray_address)
        sandbox = None
        if settings.sandbox:
            from aicluster.runtime.sandbox import jobdisk

            limit = jobdisk.probe(settings.state_dir)  # "loop" where the kernel can hold it
            sandbox = SandboxConfig(job_disk_gb=settings.job_disk_gb, disk_limit=limit)
        runtime = Runtime(settings.state_dir, sandbox=sandbox)
        discover = discover_nodes
    plane = ControlPlane(settings=settings, store=store, clock=clock, runtime=runtime)
    if settings.sandbox:
        from aicluster.runtime.sandbox.cgroups import support

        plane.resource_limits = support()
    if settings.ray_address is not None:
        from aicluster.control.views.metrics import SERVING
        from aicluster.serve import Serving, drift, rollout

        sandboxed = runtime.sandbox if runtime is not None else None
        plane.serving = Serving(
            store, clock, metrics=SERVING, sandbox=sandboxed, timeout_s=settings.predict_timeout_s
        )
        rollout.install(plane.serving, store)
        plane.drift = drift.install(plane.serving, store, clock)
        from aicluster.control.learning import pipelines

        pipelines.install(plane.serving, store, plane.drift)

    def make_loop() -> ControlLoop:
        return ControlLoop(
            plane.leader_store(),  # fenced by the lease's epoch
            runtime,
            discover,
            clock,
            # follow_config: the configuration applied in the store (`config apply`)
            LoopSettings(
                interval_s=interval_s,
                follow_config=True,
                power=dict(cluster.power) if cluster is not None else {},
                budgets=cluster.budgets if cluster is not None else (),
            ),
            lease=plane.still_leading,
            provider=provider,
        )

    plane.loop_factory = make_loop
    return plane


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    add_arguments(parser)  # the settings' options (control/serveroptions.py), as `up` has them
    parser.add_argument("--tenants", type=Path, default=None, help="tenants file to load")
    parser.add_argument(
        "--cluster", type=Path, default=None, help="cluster file: its power model and budgets"
    )
    parser.add_argument(
        "--config", type=Path, default=None, help="scheduler configuration file (docs/config.md)"
    )
    parser.add_argument(
        "--power-provider",
        default=None,
        help="what powers nodes down and up under power saving: 'embedded' (the embedded "
        "cluster of --state-dir) or a script provider's YAML file (docs/deploy.md)",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="control loop period (s)")
    parser.add_argument(
        "--ca", type=Path, default=None, help="CA of --tls-cert, for this machine's CLI"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = settings_from(vars(args), state_dir=args.state_dir.resolve())
        check_tls(settings)
    except (InsecureBinding, ValueError) as error:
        print(f"aicluster: {error}", file=sys.stderr)
        return 2
    if not settings.tls and not is_loopback(settings.host):
        log.warning(
            "serving plain HTTP on %s: bearer tokens and job specs cross the network in clear; "
            "serve HTTPS with --tls-cert and --tls-key (docs/deploy.md)",
            settings.host,
        )
    from aicluster.runtime.sandbox.bwrap import probe

    if settings.sandbox and (why := probe()) is not None:
        print(
            f"aicluster: cannot sandbox the tenants' jobs here: {why}; "
            "start with --insecure-no-sandbox to run them unsandboxed",
            file=sys.stderr,
        )
        return 2
    cluster = None
    if args.cluster is not None:  # its power model and budgets (the nodes register themselves)
        try:
            cluster = parse_cluster(args.cluster.read_text(), str(args.cluster))
        except (OSError, ConfigError) as error:
            print(f"aicluster: {error}", file=sys.stderr)
            return 2
    if args.config is not None:  # checked before anything starts: a bad file changes nothing
        try:
            parse_configuration(args.config.read_text(), str(args.config))
        except (ConfigError, OSError) as error:
            print(f"aicluster: {error}", file=sys.stderr)
            return 2
    try:
        provider = _provider(args.power_provider, settings.state_dir)
    except (OSError, ValueError, yaml.YAMLError) as error:
        print(f"aicluster: --power-provider: {error}", file=sys.stderr)
        return 2
    plane = build_plane(settings, interval_s=args.interval, cluster=cluster, provider=provider)
    write_admin_token(plane.store, settings.state_dir)
    if args.tenants is not None:
        load_tenants(plane.store, args.tenants)
    if args.config is not None:
        apply_config_file(plane.store, args.config)
    plane.start()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(plane),
            host=settings.host,
            port=settings.port,
            log_level="warning",
            ssl_certfile=settings.tls_cert,
            ssl_keyfile=settings.tls_key,
        )
    )
    info: dict[str, Any] = {"url": client_url(settings), "pid": os.getpid()}
    if args.ca is not None:
        info["ca"] = str(args.ca.resolve())
    _write_server_file(settings, info)

    def stop(*_: Any) -> None:
        server.should_exit = True

    signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    finally:
        plane.shutdown()
        plane.store.close()
    return 0


def _provider(given: str | None, state_dir: Path) -> NodeProvider | None:
    from aicluster.runtime.cluster.providers import DetachedEmbeddedProvider, load_provider

    if given is None:
        return None
    if given == "embedded":
        return DetachedEmbeddedProvider(state_dir)
    return load_provider(given)


def check_tls(settings: ServerSettings) -> None:
    """Raise ``ValueError`` (readable) unless the certificate and key load and match: uvicorn
    would otherwise fail with a traceback once the plane is up."""
    if settings.tls_cert is None or settings.tls_key is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(
            f"cannot serve HTTPS with --tls-cert {settings.tls_cert} and --tls-key "
            f"{settings.tls_key}: {error}"
        ) from None


def client_url(settings: ServerSettings) -> str:
    """The URL this machine's CLI uses (``server.json``). Listening on every address with
    HTTPS, it names this machine by its fully qualified name, the name its certificate is
    expected to hold (a client checks it)."""
    if settings.tls and settings.host in ("0.0.0.0", "::", ""):
        return f"https://{socket.getfqdn()}:{settings.port}"
    return settings.url


def _write_server_file(settings: ServerSettings, data: dict[str, Any]) -> None:
    write_private(settings.state_dir / "server.json", json.dumps(data))


if __name__ == "__main__":
    sys.exit(main())
