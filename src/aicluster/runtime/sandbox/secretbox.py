"""Job secrets at rest: sealed with a key of the state directory, opened only by the launcher.

A job spec's ``secrets:`` are sealed by the control plane before the store sees them and opened
by the rank's actor (root, on the node) just before it starts the rank's process, which gets them
as environment variables. Between the two they are sealed tokens: in the store, in Ray's task
arguments and on disk. The plain values never reach the store, the run directory, an event or a
log of the control plane.

A sealed token is ``aicsec1:`` + a Fernet token (AES-128-CBC and HMAC-SHA256, from
``cryptography``) of ``tenant \\n name \\n value``: opening checks the tenant and the variable's
name, so a token copied into another tenant's spec, or under another name, does not open.

The key is a Fernet key in ``<state_dir>/secrets.key``, made on first use (mode 0600, the
control plane's user: root), never mounted into a sandbox (the sandbox hides the state
directory). On several machines the state directory is shared, so every node and a standby
control plane read the same key. A key that is group- or world-readable is refused. Lose or
replace the key and the sealed secrets of stored jobs no longer open: their ranks fail to start
and say so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from aicluster.core import JobSpec
from aicluster.core.jobspec import MAX_SECRET_BYTES, SEALED_PREFIX

__all__ = ["KEY_FILE", "SecretBox", "SecretError", "key_file"]

#: The key's file name in the state directory.
KEY_FILE = "secrets.key"


class SecretError(ValueError):
    """A secret cannot be sealed (too large) or opened (no key, another key, not this job's)."""


def key_file(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / KEY_FILE


class SecretBox:
    """Seals and opens job secrets with the key of ``state_dir`` (read, or made, on first use)."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = key_file(state_dir)
        self._fernet: Fernet | None = None

    def _key(self, create: bool) -> Fernet:
        if self._fernet is None:
            self._fernet = Fernet(_load_key(self.path, create))
        return self._fernet

    def seal(self, tenant: str, name: str, value: str) -> str:
        """The sealed token of ``value``, for ``tenant``'s variable ``name``."""
        data = value.encode("utf-8")
        if len(data) > MAX_SECRET_BYTES:
            raise SecretError(f"secrets: {name}: a secret is larger than {MAX_SECRET_BYTES} bytes")
        token = self._key(create=True).encrypt(_payload(tenant, name) + data)
        return SEALED_PREFIX + token.decode("ascii")

    def open(self, tenant: str, name: str, sealed: str) -> str:
        """The value sealed in ``sealed``; :class:`SecretError` unless it is ``tenant``'s
        ``name`` sealed with this key. The message never holds the value."""
        if not sealed.startswith(SEALED_PREFIX):
            raise SecretError(f"secret {name} is not sealed")
        try:
            data = self._key(create=False).decrypt(sealed[len(SEALED_PREFIX) :].encode("ascii"))
        except (InvalidToken, UnicodeEncodeError):
            raise SecretError(
                f"secret {name} does not open with {self.path} (was the key replaced?)"
            ) from None
        header = _payload(tenant, name)
        if not data.startswith(header):
            raise SecretError(f"secret {name} was sealed for another job's variable or tenant")
        return data[len(header) :].decode("utf-8")

    def seal_spec(self, tenant: str, spec: JobSpec) -> JobSpec:
        """``spec`` with every secret sealed for ``tenant`` (what the store may keep)."""
        if not spec.secrets:
            return spec
        values = spec.secret_values()
        return spec.with_secret_values(
            {name: self.seal(tenant, name, value) for name, value in values.items()}
        )

    def open_all(self, tenant: str, sealed: Mapping[str, str]) -> dict[str, str]:
        """Every value of ``sealed`` (name -> token), opened."""
        return {name: self.open(tenant, name, token) for name, token in sealed.items()}


def _payload(tenant: str, name: str) -> bytes:
    # Tenant and variable names hold no newline (their patterns), so the header is unambiguous.
    return f"{tenant}\n{name}\n".encode()


def _load_key(path: Path, create: bool) -> bytes:
    """The key in ``path``, made first when ``create`` and there is none (atomically: of two
    processes making it at once, both use the one that was linked first)."""
    try:
        return _read_key(path)
    except FileNotFoundError:
        if not create:
            raise SecretError(f"no secrets key at {path}: the control plane makes it") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(Fernet.generate_key() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)  # never replaces a key another process made meanwhile
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"{path} is not a regular file")
        if info.st_mode & 0o077:
            raise SecretError(
                f"{path} may be read by others (mode {stat.S_IMODE(info.st_mode):o}): "
                f"chmod 600 {path}"
            )
        key = handle.read(1024).strip()
    try:
        Fernet(key)
    except ValueError:
        raise SecretError(f"{path} does not hold a Fernet key") from None
    return key
