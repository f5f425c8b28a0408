"""Bearer-token authentication and per-tenant authorization for the API."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from aicluster.store import AuthenticationError, Principal, Role

__all__ = ["ANONYMOUS_OPERATOR", "CurrentPrincipal", "require_cluster_admin", "require_role"]

#: Who a request is when the server runs with auth disabled (loopback only).
ANONYMOUS_OPERATOR = Principal(user="local", cluster_admin=True)

_UNAUTHORIZED = HTTPException(
    status.HTTP_401_UNAUTHORIZED,
    detail="missing or invalid bearer token",
    headers={"WWW-Authenticate": "Bearer"},
)


def current_principal(request: Request) -> Principal:
    """The caller, from ``Authorization: Bearer <token>``; 401 if absent or not valid."""
    plane = request.app.state.plane
    if not plane.settings.auth:
        return ANONYMOUS_OPERATOR
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _UNAUTHORIZED
    try:
        principal: Principal = plane.store.authenticate(token.strip())
        return principal
    except AuthenticationError:
        raise _UNAUTHORIZED from None


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


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
