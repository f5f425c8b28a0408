"""What a server without authentication (``--no-auth``, loopback only) accepts: requests from
this machine's own programs, not from web pages a browser on it happens to show.

Binding loopback keeps other machines out, but not a page of another site: its scripts and forms
can make the browser send requests to ``127.0.0.1``, and a name of the attacker's that resolves
to ``127.0.0.1`` (DNS rebinding) even makes them same-origin. So, without auth, every request:

* names this server in ``Host``: a loopback name or address (``localhost``, ``127.0.0.1``,
  ``[::1]``, ...) with the port the server listens on, so a rebound name is refused;
* if it has an ``Origin`` header, names such an origin (``http://127.0.0.1:8765``);
* if it may change state (any method but GET, HEAD, OPTIONS), has a body type that a page of
  another site cannot send without the browser asking first (JSON, YAML, gzip: this server never
  grants such a CORS preflight), or the ``X-Aicluster-Client`` header that the CLI and the
  dashboard send. An HTML form or a ``text/plain`` ``fetch`` has neither.

Anything else is refused with 403 before the application sees it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from aicluster.api.auth import SAFE_METHODS
from aicluster.control.settings import is_loopback

__all__ = ["CLIENT_HEADER", "LocalOnly", "local_request_problem"]

#: Sent by the CLI and the dashboard on every request; a cross-site page cannot add it unasked.
CLIENT_HEADER = "X-Aicluster-Client"
#: Body types a browser sends cross-site only after a preflight (none is ever granted here).
_WRITE_TYPES = re.compile(
    r"application/(json|[a-z0-9.+-]+\+json|yaml|x-yaml|gzip|octet-stream)|text/(yaml|x-yaml)"
)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _own_address(netloc: str, scheme: str, port: int) -> bool:
    """Whether ``netloc`` (``host[:port]``) is a loopback name of this server's port."""
    try:
        parts = urlsplit(f"//{netloc}")
        named_port = parts.port
    except ValueError:
        return False
    host = parts.hostname or ""
    if not host or parts.username is not None or parts.password is not None:
        return False
    return is_loopback(host) and (named_port or _DEFAULT_PORTS.get(scheme, -1)) == port


def local_request_problem(scope: Scope, default_port: int) -> str | None:
    """Why a request to a server without auth is refused (see the module), or None."""
    headers = Headers(scope=scope)
    server = scope.get("server")
    port = int(server[1]) if server and server[1] is not None else default_port
    scheme = str(scope.get("scheme", "http"))
    host = headers.get("host")
    if host is None or not _own_address(host, scheme, port):
        return (
            f"Host {host!r} is not this server: without authentication it answers only "
            f"requests to a loopback address with its port ({port})"
        )
    origin = headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not _own_address(
            parts.netloc, parts.scheme, port
        ):
            return (
                f"Origin {origin!r} is not this server: without authentication it answers "
                "no other site's pages"
            )
    if scope.get("method", "GET") not in SAFE_METHODS and CLIENT_HEADER.lower() not in headers:
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if not _WRITE_TYPES.fullmatch(media_type):
            return (
                "without authentication, a request that changes state needs a JSON or YAML "
                f"body (Content-Type: application/json, application/yaml) or the {CLIENT_HEADER} "
                f"header, which the aicluster CLI sends; got {media_type or 'no Content-Type'}"
            )
    return None


class LocalOnly:
    """ASGI middleware that refuses, with 403, requests :func:`local_request_problem` names."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        self.app, self.port = app, port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = local_request_problem(scope, self.port)
            if problem is not None:
                await JSONResponse({"error": problem}, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)
