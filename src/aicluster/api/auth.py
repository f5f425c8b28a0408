"""Bearer-token authentication and per-tenant authorization for the API.

A request authenticates with ``Authorization: Bearer <token>``, or, the dashboard's way, with
the session cookie that ``POST /v1/ui/session`` sets (``HttpOnly``, ``SameSite=Strict``): a
cookie-authenticated request that may change state (any method but GET, HEAD and OPTIONS)
must also carry the session's CSRF token in ``X-CSRF-Token`` (403 otherwise). Tokens that fail
are counted per client address and per token id (:class:`~aicluster.api.ratelimit.Limits`).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, cast

from fastapi import Depends, HTTPException, Request, status

from aicluster.core import Clock
from aicluster.store import AuthenticationError, Principal, Role, hash_token

__all__ = [
    "ANONYMOUS_OPERATOR",
    "CSRF_HEADER",
    "SAFE_METHODS",
    "SESSION_COOKIE",
    "CurrentPrincipal",
    "PrincipalCache",
    "authenticate",
    "cached_principal",
    "csrf_sent",
    "csrf_token",
    "current_principal",
    "forget_principals",
    "require_cluster_admin",
    "require_role",
]

#: Who a request is when the server runs with auth disabled (loopback only).
ANONYMOUS_OPERATOR = Principal(user="local", cluster_admin=True)

#: The dashboard's session cookie: the bearer token itself, out of reach of page scripts.
SESSION_COOKIE = "aicluster_session"
#: Where a cookie-authenticated request that changes state puts :func:`csrf_token`.
CSRF_HEADER = "X-CSRF-Token"
#: Methods that change nothing (no CSRF token needed, and no content-type rule without auth).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

_UNAUTHORIZED = HTTPException(
    status.HTTP_401_UNAUTHORIZED,
    detail="missing or invalid bearer token",
    headers={"WWW-Authenticate": "Bearer"},
)


class PrincipalCache:
    """Who each recently authenticated token speaks for, trusted for ``ttl_s`` seconds.

    Authenticating reads the token, its user and its roles: without a cache that costs about as
    much CPU as storing the job it guards. The price is staleness, bounded: a token revoked, a
    user disabled or a role changed by another server (or worker process) sharing the store
    takes effect here within ``ttl_s``; this process's own routes that change them call
    :meth:`clear`. An entry never outlives its token's expiry. Keys are token hashes (no
    plaintext is kept); failures are never cached. Thread-safe: single dict operations, atomic
    under the GIL, and a generation so that a lookup racing a :meth:`clear` is not kept.
    """

    def __init__(self, ttl_s: float, clock: Clock, max_entries: int = 10_000) -> None:
        self.ttl_s, self.clock, self.max_entries = ttl_s, clock, max_entries
        self._entries: dict[str, tuple[Principal, float]] = {}
        self.generation = 0

    def get(self, key: str) -> Principal | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.clock.now() >= entry[1]:
            self._entries.pop(key, None)
            return None
        return entry[0]

    def put(self, key: str, principal: Principal, generation: int) -> None:
        """Keep ``principal``, read from the store since :attr:`generation` was ``generation``."""
        if self.ttl_s <= 0 or generation != self.generation:
            return
        deadline = self.clock.now() + self.ttl_s
        if principal.expires_at is not None:
            deadline = min(deadline, principal.expires_at)
        if len(self._entries) >= self.max_entries:
            self._entries.clear()  # rare (that many live tokens): start over rather than track age
        self._entries[key] = (principal, deadline)

    def clear(self) -> None:
        self.generation += 1
        self._entries.clear()


def csrf_token(token: str) -> str:
    """The CSRF token of the session whose cookie holds ``token``: derived from it one way, so
    a page of another site can neither read nor compute it, and every server agrees on it."""
    return hashlib.sha256(b"aicluster-csrf\x00" + token.encode()).hexdigest()


def csrf_sent(request: Request, token: str) -> bool:
    """Whether ``request`` carries, in ``X-CSRF-Token``, the CSRF token of the session whose
    cookie holds ``token``."""
    sent = request.headers.get(CSRF_HEADER, "")
    return hmac.compare_digest(sent.encode(), csrf_token(token).encode())


def _token(request: Request) -> str:
    """The token the request presents: its bearer header, else its session cookie (checking
    the CSRF token of a cookie-authenticated request that may change state)."""
    header = request.headers.get("authorization")
    if header is None and (cookie := request.cookies.get(SESSION_COOKIE)):
        if request.method not in SAFE_METHODS and not csrf_sent(request, cookie):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                detail=f"a signed-in session must send its CSRF token ({CSRF_HEADER}) "
                "with requests that change state",
            )
        return cookie
    scheme, _, token = (header or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _UNAUTHORIZED
    return token


def cached_principal(request: Request) -> Principal | None:
    """The caller when known without asking the store (auth disabled, or the token is in the
    cache); None otherwise. For async routes on a hot path: on None, run
    :func:`current_principal` in the thread pool. Raises 401 for a missing token."""
    if not request.app.state.plane.settings.auth:
        return ANONYMOUS_OPERATOR
    cache: PrincipalCache = request.app.state.principals
    return cache.get(hash_token(_token(request)))


def current_principal(request: Request) -> Principal:
    """The caller, from ``Authorization: Bearer <token>`` or the dashboard's session cookie;
    401 if absent or not valid, 429 after too many failures (see :func:`authenticate`)."""
    if not request.app.state.plane.settings.auth:
        principal = ANONYMOUS_OPERATOR
    else:
        principal = authenticate(request, _token(request))
    request.state.principal = principal  # the actor of the call's audit record (auditlog)
    return principal


def authenticate(request: Request, token: str) -> Principal:
    """Who ``token`` speaks for: from the cache, else from the store. A token that fails is a
    401 and counts against the client's address and the token id it claims; while either has
    failed too often, tokens not in the cache are refused with 429 without asking the store."""
    plane = request.app.state.plane
    cache: PrincipalCache = request.app.state.principals
    key = hash_token(token)
    principal = cache.get(key)
    if principal is not None:
        return principal
    limits = request.app.state.limits
    address = request.client.host if request.client else ""
    limits.check_login(address, token)
    generation = cache.generation
    try:
        principal = cast(Principal, plane.store.authenticate(token))
    except AuthenticationError:
        limits.login_failed(address, token)
        raise _UNAUTHORIZED from None
    cache.put(key, principal, generation)
    return principal


def forget_principals(request: Request) -> None:
    """Call after changing tokens or roles, so this server sees the change at once."""
    request.app.state.principals.clear()


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


def readable_tenants(
    principal: Principal, tenant: str | None, since: float | None, until: float | None
) -> list[str] | None:
    """The tenants a read over ``[since, until)`` may cover: ``tenant`` if named (the caller
    needs a role there), else every tenant (None) for a cluster admin, else the caller's own.
    422 when the period is empty."""
    if since is not None and until is not None and since >= until:
        raise HTTPException(422, detail="since must be before until")
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
        return [tenant]
    return None if principal.cluster_admin else sorted(principal.roles)


def require_role(principal: Principal, tenant: str, needed: Role) -> None:
    """404 when the caller has no role in ``tenant`` (its existence is not revealed), 403 when
    its role there is too weak."""
    role = principal.role_in(tenant)
    if role is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no tenant {tenant!r}")
    if not role.allows(needed):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"this needs the {needed.value} role in tenant {tenant!r}; you are {role.value}",
        )


def require_cluster_admin(principal: Principal) -> None:
    if not principal.cluster_admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="this needs a cluster admin")
