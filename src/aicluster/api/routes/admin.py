"""Tenants, users, memberships and tokens."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import (
    CurrentPrincipal,
    forget_principals,
    require_cluster_admin,
    require_role,
)
from aicluster.api.params import TenantName, TokenId
from aicluster.api.schemas import MemberIn, TenantIn, TenantOut, TokenIn, TokenOut, UserIn
from aicluster.store import Role

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["tenants and access"])


@router.get("/whoami")
def whoami(principal: CurrentPrincipal) -> dict[str, object]:
    return {
        "user": principal.user,
        "cluster_admin": principal.cluster_admin,
        "roles": {tenant: role.value for tenant, role in principal.roles.items()},
    }


@router.get("/tenants")
def list_tenants(request: Request, principal: CurrentPrincipal) -> list[TenantOut]:
    plane = request.app.state.plane
    usage = plane.usage_by_tenant()
    return [
        TenantOut.of(tenant, usage.get(tenant.name, {}))
        for tenant in plane.store.list_tenants()
        if principal.role_in(tenant.name) is not None
    ]


@router.put("/tenants/{name}")
def put_tenant(
    request: Request, principal: CurrentPrincipal, name: TenantName, body: TenantIn
) -> TenantOut:
    """Create or update a tenant's quota, borrowing limit and weight. Cluster admins only."""
    require_cluster_admin(principal)
    if body.name != name:
        raise ValueError(f"the body names tenant {body.name!r}, the path {name!r}")
    plane = request.app.state.plane
    audit_target(request, tenant=name)
    tenant = plane.store.put_tenant(body.to_tenant(), principal.user)
    plane.wake()
    return TenantOut.of(tenant, plane.usage_by_tenant().get(name, {}))


@router.delete("/tenants/{name}", status_code=204)
def delete_tenant(request: Request, principal: CurrentPrincipal, name: TenantName) -> Response:
    require_cluster_admin(principal)
    audit_target(request, tenant=name)
    request.app.state.plane.store.delete_tenant(name, principal.user)
    forget_principals(request)  # its role bindings went with it
    return Response(status_code=204)


@router.post("/users", status_code=201)
def create_user(request: Request, principal: CurrentPrincipal, body: UserIn) -> dict[str, object]:
    require_cluster_admin(principal)
    audit_target(request, object=body.name)
    user = request.app.state.plane.store.create_user(
        body.name, principal.user, cluster_admin=body.cluster_admin
    )
    return {"name": user.name, "cluster_admin": user.cluster_admin}


@router.put("/tenants/{tenant}/members")
def grant(
    request: Request, principal: CurrentPrincipal, tenant: TenantName, body: MemberIn
) -> dict[str, str]:
    """Give a user a role in the tenant. Tenant admins and cluster admins."""
    require_role(principal, tenant, Role.ADMIN)
    audit_target(request, tenant=tenant, object=body.user)
    request.app.state.plane.store.grant_role(body.user, tenant, body.role, principal.user)
    forget_principals(request)
    return {"user": body.user, "tenant": tenant, "role": body.role.value}


@router.post("/tokens", status_code=201)
def create_token(request: Request, principal: CurrentPrincipal, body: TokenIn) -> TokenOut:
    """A new token for yourself, or (cluster admins) for another user. Shown once."""
    user = body.user or principal.user
    if user != principal.user:
        require_cluster_admin(principal)
    plane = request.app.state.plane
    expires = None
    if body.expires_in_seconds is not None:
        expires = plane.clock.now() + body.expires_in_seconds
    issued = plane.store.create_token(
        user, principal.user, description=body.description, expires_at=expires
    )
    audit_target(request, object=issued.info.id)
    return TokenOut.of(issued.info, issued.token)


@router.get("/tokens")
def list_tokens(request: Request, principal: CurrentPrincipal) -> list[TokenOut]:
    store = request.app.state.plane.store
    user = None if principal.cluster_admin else principal.user
    return [TokenOut.of(info) for info in store.list_tokens(user)]


@router.delete("/tokens/{token_id}")
def revoke_token(request: Request, principal: CurrentPrincipal, token_id: TokenId) -> TokenOut:
    store = request.app.state.plane.store
    mine = {info.id for info in store.list_tokens(principal.user)}
    if token_id not in mine:
        require_cluster_admin(principal)
    revoked = TokenOut.of(store.revoke_token(token_id, principal.user))
    forget_principals(request)
    return revoked
