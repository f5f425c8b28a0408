"""A small typed client of the REST API; errors become one readable line."""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ApiError", "Client", "Target", "default_home", "resolve_target", "tls_context"]


class ApiError(Exception):
    """The server answered with an error, or could not be reached."""


def default_home() -> Path:
    return Path(os.environ.get("AICLUSTER_HOME", Path.home() / ".aicluster"))


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    #: PEM file of the CA that signed an HTTPS server's certificate (None: the system's CAs).
    ca: str | None = None


def resolve_target(
    home: Path, url: str | None = None, token: str | None = None, ca: str | None = None
) -> Target:
    """Server URL, token and CA: flags, then AICLUSTER_URL/AICLUSTER_TOKEN/AICLUSTER_CA, then
    the state dir that ``aicluster up`` wrote (server.json with its ``ca``, admin.token)."""
    url = url or os.environ.get("AICLUSTER_URL")
    ca = ca or os.environ.get("AICLUSTER_CA") or None
    if url is None:
        server_file = home / "server.json"
        if not server_file.exists():
            raise ApiError(
                f"no server found: run `aicluster up` (state dir {home}) or set AICLUSTER_URL"
            )
        info = json.loads(server_file.read_text())
        url = str(info["url"])
        ca = ca or info.get("ca")
    token = token or os.environ.get("AICLUSTER_TOKEN")
    if token is None and (home / "admin.token").exists():
        token = (home / "admin.token").read_text().strip()
    return Target(url.rstrip("/"), token, ca)


def tls_context(ca: str | os.PathLike[str] | None) -> ssl.SSLContext:
    """How a client checks an HTTPS server: against the CA in ``ca`` (a PEM file), else the
    system's trusted CAs; certificate and host name always checked. Raises :class:`ApiError`
    for a CA file that cannot be read."""
    try:
        return ssl.create_default_context(cafile=os.fspath(ca) if ca else None)
    except (OSError, ssl.SSLError) as error:
        raise ApiError(f"--ca {ca}: cannot load it as PEM CA certificates ({error})") from None


class Client:
    def __init__(self, target: Target, timeout: float = 30.0) -> None:
        # X-Aicluster-Client: a server without auth takes writes only from clients that say so
        # (or send JSON/YAML), never from a cross-site form (aicluster.api.localonly).
        headers = {"X-Aicluster-Client": "cli"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        self._ca = target.ca
        self._http = httpx.Client(
            base_url=target.url, headers=headers, timeout=timeout, verify=tls_context(target.ca)
        )

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if response.status_code >= 400:
            raise ApiError(_message(response))
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            hint = _hint(error, self._http.base_url, self._ca)
            message = f"cannot reach the server at {self._http.base_url}: {error}{hint}"
            raise ApiError(message) from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=body, **kwargs)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json=body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def submit(self, text: str, idempotency_key: str | None = None) -> Any:
        headers = {"Content-Type": "application/yaml"}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        return self.request("POST", "/v1/jobs", content=text.encode(), headers=headers)

    def exists(self, path: str) -> bool:
        """Whether a HEAD of ``path`` finds it (200) rather than not (404)."""
        response = self._send("HEAD", path)
        if response.status_code == 404:
            return False
        if response.status_code >= 400:
            raise ApiError(f"HTTP {response.status_code} asking for {path}")
        return True

    def has_code(self, tenant: str, sha256: str) -> bool:
        """Whether ``tenant`` has stored the code archive ``sha256`` (an upload to skip)."""
        return self.exists(f"/v1/tenants/{tenant}/code/{sha256}")

    def upload_code(self, tenant: str, archive: Path) -> Any:
        """Stream a code archive (``tar.gz``) to ``tenant``'s code store."""
        with archive.open("rb") as body:
            headers = {"Content-Type": "application/gzip"}
            return self.request("POST", f"/v1/tenants/{tenant}/code", content=body, headers=headers)


def _hint(error: httpx.HTTPError, url: httpx.URL, ca: str | None) -> str:
    """What to do about a transport error that TLS explains."""
    text = str(error)
    if "CERTIFICATE_VERIFY_FAILED" in text:
        against = f"the CA in {ca}" if ca else "the system's trusted CAs"
        return (
            f" (the server's TLS certificate does not verify against {against}: give the CA "
            "that signed it with --ca FILE or AICLUSTER_CA)"
        )
    if url.scheme == "https" and ("WRONG_VERSION_NUMBER" in text or "record layer" in text):
        return " (the server does not speak HTTPS there: is its URL http://?)"
    if url.scheme == "http" and isinstance(error, httpx.RemoteProtocolError):
        return " (does the server serve HTTPS? then its URL is https://)"
    return ""


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    error = body.get("error") if isinstance(body, dict) else None
    return f"{error or body} (HTTP {response.status_code})"
