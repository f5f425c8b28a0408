"""Server settings and the loopback rule for running without authentication."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from aicluster.artifacts import MAX_TENANT_BYTES, MAX_UPLOAD_BYTES

__all__ = ["InsecureBinding", "ServerSettings", "is_loopback"]

#: Requests larger than this are refused with 413 before they are read.
MAX_BODY_BYTES = 1 << 20


class InsecureBinding(ValueError):
    """Authentication is disabled but the server was asked to listen beyond loopback."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSettings:
    """How the control plane serves: where, with which state, and whether tokens are required."""

    state_dir: Path = field(default_factory=lambda: Path("state"))
    db_url: str | None = None  # None: SQLite in state_dir
    host: str = "127.0.0.1"
    port: int = 8765
    auth: bool = True
    ray_address: str | None = None
    #: Run each tenant's jobs in its sandbox (``aicluster up --insecure-no-sandbox``: not).
    sandbox: bool = True
    #: Disk each sandboxed job's data directory may hold (``aicluster up --job-disk-gb``).
    job_disk_gb: float = 100.0
    max_body_bytes: int = MAX_BODY_BYTES  # every route but the code upload
    #: Caps of ``POST /v1/tenants/{tenant}/code`` (413 over them): one upload, and one
    #: tenant's stored archives in all.
    max_code_upload_bytes: int = MAX_UPLOAD_BYTES
    max_code_bytes_per_tenant: int = MAX_TENANT_BYTES
    #: How long an authenticated token is trusted without asking the store again (0: never).
    #: Revocations made on another server sharing the store take effect within this time.
    auth_cache_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.auth and not is_loopback(self.host):
            raise InsecureBinding(
                f"refusing to listen on {self.host} with authentication disabled: "
                "disable auth only on a loopback address (127.0.0.1, ::1, localhost)"
            )

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
