"""Server settings and the loopback rule for running without authentication; the control loop's
settings.

The control plane holds them and the API reads them (``plane.settings``), so they live here,
below the API.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from aicluster.artifacts import MAX_TENANT_BYTES, MAX_UPLOAD_BYTES
from aicluster.configuration import Configuration, HealthConfig
from aicluster.core import GpuPower
from aicluster.core.topology import PowerBudget
from aicluster.scheduler import SchedulerConfig
from aicluster.sim.forecast import ForecastOptions
from aicluster.sim.predict import PredictionOptions
from aicluster.store.leader import LEASE_S

__all__ = [
    "ACTOR",
    "BadTLS",
    "InsecureBinding",
    "LoopSettings",
    "ServerSettings",
    "check_rate",
    "is_loopback",
    "option",
]

#: The configuration file's defaults: the loop's own settings take them (written once, there).
_FILE = Configuration()
#: Who the control loop's writes to the store are recorded as (events, transitions).
ACTOR = "control-loop"
#: The default data quota of a tenant: 100 GB.
MAX_DATA_BYTES = 100 * 10**9
#: Requests larger than this are refused with 413 before they are read.
MAX_BODY_BYTES = 1 << 20


class InsecureBinding(ValueError):
    """Authentication is disabled but the server was asked to listen beyond loopback."""


class BadTLS(ValueError):
    """``tls_cert`` without ``tls_key`` or the other way round."""


def check_rate(name: str, value: str) -> None:
    """Raise ``ValueError`` unless ``value`` is "" or rate limits in the ``limits`` library's
    notation (``"10/second;100/minute"``)."""
    if not value.strip():
        return
    from limits import parse_many

    try:
        parse_many(value)
    except ValueError:
        raise ValueError(
            f"{name}: {value!r} is not a rate such as '10/second' or '5/second;100/minute'"
        ) from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def option(
    flag: str,
    help: str,
    *,
    negates: bool = False,
    pair: str | None = None,
    minimum: float | None = None,
) -> Any:
    """The command-line option of a :class:`ServerSettings` field (``field(metadata=...)``):
    ``aicluster up``'s option and the server process's flag are made from it
    (:mod:`aicluster.control.serveroptions`). ``negates``: a flag that turns a true field off;
    ``pair``: its positive form, shown with it by ``up`` (``--auth / --no-auth``)."""
    return {"flag": flag, "help": help, "negates": negates, "pair": pair, "minimum": minimum}


@dataclass(frozen=True)
class ServerSettings:
    """How the control plane serves: where, with which state, and whether tokens are required.

    A field with an ``option`` is a command-line option of both ``aicluster up`` and the server
    process, with this default; the others are set only in code (the tests)."""

    state_dir: Path = field(default_factory=lambda: Path("state"))
    db_url: str | None = field(  # None: SQLite in state_dir
        default=None,
        metadata=option("--db", "database URL (default: SQLite in the state directory)"),
    )
    host: str = field(
        default="127.0.0.1", metadata=option("--host", "API address (off loopback only with auth)")
    )
    port: int = field(default=8765, metadata=option("--port", "API port", minimum=1))
    auth: bool = field(
        default=True,
        metadata=option(
            "--no-auth",
            "require bearer tokens (--no-auth: loopback only)",
            negates=True,
            pair="--auth",
        ),
    )
    ray_address: str | None = field(
        default=None, metadata=option("--ray-address", "join this Ray cluster")
    )
    #: Run each tenant's jobs in its sandbox.
    sandbox: bool = field(
        default=True,
        metadata=option(
            "--insecure-no-sandbox",
            "run jobs unsandboxed, as the control plane's user (a single trusted team only)",
            negates=True,
        ),
    )
    #: Disk each sandboxed job's data directory may hold (None: a quarter of the state
    #: disk's free space when the job starts).
    job_disk_gb: float | None = field(
        default=None,
        metadata=option(
            "--job-disk-gb",
            "disk each job's checkpoints, export and files may take (default: a quarter of the "
            "state disk's free space)",
            minimum=0.001,
        ),
    )
    max_body_bytes: int = MAX_BODY_BYTES  # every route but the code upload
    #: Caps of ``POST /v1/tenants/{tenant}/code`` (413 over them): one upload, and one
    #: tenant's stored archives in all.
    max_code_upload_bytes: int = field(
        default=MAX_UPLOAD_BYTES,
        metadata=option(
            "--max-code-upload-bytes",
            "cap on one code upload (aicluster submit ships code)",
            minimum=1,
        ),
    )
    max_code_bytes_per_tenant: int = field(
        default=MAX_TENANT_BYTES,
        metadata=option(
            "--max-code-bytes-per-tenant", "cap on the code archives one tenant stores", minimum=1
        ),
    )
    #: Bytes of dataset shards a tenant may store unless its own data quota says otherwise
    #: (``PUT /v1/tenants/{tenant}/data-policy``).
    max_data_bytes_per_tenant: int = field(
        default=MAX_DATA_BYTES,
        metadata=option(
            "--max-data-bytes-per-tenant",
            "dataset bytes a tenant may store where its data policy sets no quota",
            minimum=1,
        ),
    )
    #: How long an authenticated token is trusted without asking the store again (0: never).
    #: Revocations made on another server sharing the store take effect within this time.
    auth_cache_s: float = 2.0
    #: HTTPS: the server's certificate chain and private key (PEM files), both or neither.
    tls_cert: Path | None = field(
        default=None,
        metadata=option("--tls-cert", "serve the API over HTTPS with this certificate chain (PEM)"),
    )
    tls_key: Path | None = field(
        default=None, metadata=option("--tls-key", "the private key of --tls-cert (PEM)")
    )
    #: Jobs one tenant may have PENDING at once; a submission beyond is a 429 (0: no cap).
    max_pending_per_tenant: int = field(
        default=5000,
        metadata=option(
            "--max-pending-per-tenant",
            "jobs one tenant may have waiting (0: no cap); then 429",
            minimum=0,
        ),
    )
    #: Job submissions allowed per token and per tenant, in the ``limits`` library's notation
    #: (``"300/second;3000/minute"``: each window is a moving window; "": no limit). Over
    #: either, a submission is a 429 with ``Retry-After``.
    submit_rate_per_token: str = field(
        default="300/second;3000/minute",
        metadata=option(
            "--submit-rate-per-token", "job submissions per token, e.g. '300/second;3000/minute'"
        ),
    )
    submit_rate_per_tenant: str = field(
        default="600/second;6000/minute",
        metadata=option("--submit-rate-per-tenant", 'job submissions per tenant ("": no limit)'),
    )
    #: Failed authentications (a token that is not valid) allowed per client address and per
    #: token id; over either, authentication from that address or for that token id is a 429
    #: until the window has room again (tokens this server has just authenticated excepted).
    failed_logins_per_address: str = "30/minute"
    failed_logins_per_token: str = "10/minute"
    #: How long the gateway waits for a model's answer before it answers 504 (every server).
    predict_timeout_s: float = field(
        default=30.0,
        metadata=option(
            "--predict-timeout-s",
            "seconds a prediction may take before the gateway answers 504",
            minimum=0.1,
        ),
    )
    #: PostgreSQL: how long a standby waits for a silent leader before it takes over
    #: (``aicluster.store.leader``; the leader stops acting a third of it earlier).
    lease_s: float = field(
        default=LEASE_S,
        metadata=option(
            "--lease-s",
            "PostgreSQL: seconds a standby waits for a silent leader before taking over",
            minimum=1,
        ),
    )

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise BadTLS("give both --tls-cert and --tls-key (or neither, for plain HTTP)")
        if not self.auth and not is_loopback(self.host):
            raise InsecureBinding(
                f"refusing to listen on {self.host} with authentication disabled: "
                "disable auth only on a loopback address (127.0.0.1, ::1, localhost)"
            )
        for spec in fields(self):  # the options' lower bounds (``option(minimum=...)``)
            minimum = spec.metadata.get("minimum")
            value = getattr(self, spec.name)
            if minimum is not None and value is not None and value < minimum:
                flag = spec.metadata["flag"]
                raise ValueError(f"{flag} must be at least {minimum:g}, not {value!r}")
        if self.max_pending_per_tenant < 0:
            raise ValueError("max_pending_per_tenant must be 0 (no cap) or more")
        if not 1.0 <= self.lease_s <= 600.0:
            raise ValueError(f"lease_s must be 1 to 600 seconds, not {self.lease_s:g}")
        for name in (
            "submit_rate_per_token",
            "submit_rate_per_tenant",
            "failed_logins_per_address",
            "failed_logins_per_token",
        ):
            check_rate(name, getattr(self, name))

    @property
    def tls(self) -> bool:
        """Whether the API is served over HTTPS."""
        return self.tls_cert is not None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


@dataclass(frozen=True)
class LoopSettings:
    """What the control loop (:class:`~aicluster.control.loop.loop.ControlLoop`) runs with besides
    its collaborators: the scheduler's settings and the loop's own. A configuration applied in
    the store replaces those it sets (``ControlLoop.configure``: ``scheduler_config`` and
    ``loop_options`` of :mod:`aicluster.configuration`); the others are the server's."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    interval_s: float = 1.0  # between ticks (a tick that frees work runs the next at once)
    #: The watchdog reports a tick that runs longer than this.
    tick_budget_s: float = 10.0
    #: Take up the configuration applied in the store (`config apply`) at the next tick.
    follow_config: bool = False
    #: How long a stopped gang has to checkpoint before it is killed (preemption, cancel).
    stop_grace_s: float = _FILE.preemption.grace_period_s
    health: HealthConfig = field(default_factory=HealthConfig)  # hangs and stragglers
    #: A restart's backoff while attempts crash before their first step: first delay, cap.
    backoff_s: tuple[float, float] = _FILE.health.restart_backoff_s
    cordon_stragglers: bool = _FILE.health.cordon_stragglers  # cordon a straggler's node
    #: An elastic job running short of workers is grown back at most this often.
    grow_after_s: float = _FILE.elastic.grow_after_s
    #: Predicted run times for jobs that give no estimate (control/loop/predictions.py); None: off.
    prediction: PredictionOptions | None = None
    #: Estimated starts of queued jobs (sim/forecast.py), how often and how far; None: off.
    estimates: ForecastOptions | None = field(default_factory=ForecastOptions)
    #: The cluster file's power model per GPU type and its power budgets (``up --cluster``):
    #: the live scheduler's watts and budgets, as the simulator's from the same file.
    power: Mapping[str, GpuPower] = field(default_factory=dict)
    budgets: tuple[PowerBudget, ...] = ()
