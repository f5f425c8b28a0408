"""Ray's own boundary: token authentication, so that only holders of the token act on Ray.

Ray (2.60) checks a shared token on every connection to its GCS and raylets when
``RAY_AUTH_MODE=token``; each process (nodes, drivers, workers) reads it from the file that
``RAY_AUTH_TOKEN_PATH`` names. aicluster keeps that file in the state directory, mode 0600 and
root's: the control plane, the Ray nodes and their workers (the trusted launchers) read it. A job's
process gets neither the variables (:mod:`aicluster.runtime.environment`) nor the file (its sandbox
hides the state directory), so it cannot act as a Ray driver: ``ray.init`` is refused.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from aicluster.artifacts.private import private_file

__all__ = ["AUTH_MODE", "TOKEN_PATH", "enable_token_auth", "token_file"]

AUTH_MODE = "RAY_AUTH_MODE"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"


def token_file(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / "ray.token"


def enable_token_auth(path: str | os.PathLike[str]) -> Path:
    """Make the token file unless it exists (0600) and turn token authentication on for this
    process and every Ray process it starts (they inherit the environment). Idempotent."""
    token = Path(path)
    token.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        private_file(token)  # narrowed to 0600 where an older one was not
    else:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))
    os.environ[AUTH_MODE] = "token"
    os.environ[TOKEN_PATH] = str(token.resolve())
    return token
