"""Users, API tokens, role bindings and authentication.

A token is ``aic_<id>_<secret>``: ``id`` is 12 hex characters stored in clear (the lookup key,
not a secret), ``secret`` is 32 random bytes. Only the SHA-256 of the whole token is stored: a
fast hash is right for high-entropy random tokens (a slow password hash buys nothing against
2^256 guesses), and the comparison uses :func:`hmac.compare_digest` so its time does not depend
on how many characters match.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Any

from sqlalchemy import Connection, Row, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from aicluster.store import schema
from aicluster.store.base import StoreBase
from aicluster.store.errors import AuthenticationError, Conflict, NotFound
from aicluster.store.records import IssuedToken, Principal, Role, TokenInfo, UserRecord

__all__ = ["TOKEN_PREFIX", "AuthOps", "hash_token"]

TOKEN_PREFIX = "aic_"
_TOKEN = re.compile(r"^aic_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$")
# last_used_at is refreshed at most this often, so authentication stays a read, not a write.
_TOUCH_EVERY_S = 60.0
_DUMMY_HASH = hashlib.sha256(b"no such token").hexdigest()
users, tokens, bindings = schema.users, schema.api_tokens, schema.role_bindings


def hash_token(token: str) -> str:
    """SHA-256 hex of a token: what the store keeps instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


class AuthOps(StoreBase):
    def create_user(self, name: str, actor: str, *, cluster_admin: bool = False) -> UserRecord:
        """Create a user. Raises :class:`Conflict` if it exists, ``ValueError`` for a bad name."""
        if not _USER.match(name):
            raise ValueError(f"invalid user name {name!r} (letters, digits, . _ @ + -)")
        now = self._now()
        try:
            with self._write() as connection:
                connection.execute(
                    insert(users).values(
                        name=name, cluster_admin=cluster_admin, disabled=False, created_at=now
                    )
                )
                self._log(
                    connection,
                    actor=actor,
                    kind="user.created",
                    details={"user": name, "cluster_admin": cluster_admin},
                )
        except IntegrityError:
            raise Conflict(f"user {name!r} already exists") from None
        return UserRecord(name=name, created_at=now, cluster_admin=cluster_admin)

    def get_user(self, name: str) -> UserRecord:
        """The user and its roles. Raises :class:`NotFound`."""
        with self._read() as connection:
            return _user(connection, _user_row(connection, name))

    def list_users(self) -> list[UserRecord]:
        with self._read() as connection:
            rows = connection.execute(select(users).order_by(users.c.name)).all()
            return [_user(connection, row) for row in rows]

    def set_user_disabled(self, name: str, disabled: bool, actor: str) -> UserRecord:
        """Disable (or enable) a user: its tokens stop authenticating. Idempotent."""
        with self._write() as connection:
            _user_row(connection, name)
            connection.execute(update(users).where(users.c.name == name).values(disabled=disabled))
            kind = "user.disabled" if disabled else "user.enabled"
            self._log(connection, actor=actor, kind=kind, details={"user": name})
            return _user(connection, _user_row(connection, name))

    def grant_role(self, user: str, tenant: str, role: Role, actor: str) -> None:
        """Give ``user`` ``role`` in ``tenant``, replacing any role it had there. Idempotent.

        Raises :class:`NotFound` for an unknown user or tenant.
        """
        role = Role(role)
        with self._write() as connection:
            _user_row(connection, user)
            if (
                connection.execute(
                    select(schema.tenants.c.name).where(schema.tenants.c.name == tenant)
                ).first()
                is None
            ):
                raise NotFound(f"no tenant {tenant!r}")
            where = (bindings.c.user_name == user) & (bindings.c.tenant == tenant)
            current = connection.execute(select(bindings.c.role).where(where)).scalar()
            if current == role.value:
                return
            connection.execute(delete(bindings).where(where))
            connection.execute(insert(bindings).values(user_name=user, tenant=tenant, role=role))
            self._log(
                connection,
                actor=actor,
                kind="role.granted",
                tenant=tenant,
                details={"user": user, "role": role.value, "previous": current},
            )

    def revoke_role(self, user: str, tenant: str, actor: str) -> None:
        """Remove ``user``'s role in ``tenant``. Idempotent (no role: nothing happens)."""
        with self._write() as connection:
            where = (bindings.c.user_name == user) & (bindings.c.tenant == tenant)
            if connection.execute(delete(bindings).where(where)).rowcount:
                self._log(
                    connection,
                    actor=actor,
                    kind="role.revoked",
                    tenant=tenant,
                    details={"user": user},
                )

    def create_token(
        self,
        user: str,
        actor: str,
        *,
        description: str = "",
        expires_at: float | None = None,
    ) -> IssuedToken:
        """A new bearer token for ``user``; the plaintext is in the result and nowhere else.

        Raises :class:`NotFound` for an unknown user.
        """
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        token = f"{TOKEN_PREFIX}{token_id}_{secret}"
        info = TokenInfo(
            id=token_id,
            user=user,
            created_at=self._now(),
            description=description[:200],
            expires_at=expires_at,
        )
        with self._write() as connection:
            _user_row(connection, user)
            connection.execute(
                insert(tokens).values(
                    id=info.id,
                    user_name=user,
                    token_hash=hash_token(token),
                    description=info.description,
                    created_at=info.created_at,
                    expires_at=expires_at,
                )
            )
            self._log(
                connection,
                actor=actor,
                kind="token.created",
                details={"user": user, "token_id": token_id, "description": info.description},
            )
        return IssuedToken(info, token)

    def list_tokens(self, user: str | None = None) -> list[TokenInfo]:
        """Tokens' metadata (never the secret), one user's or everyone's."""
        query = select(tokens).order_by(tokens.c.created_at, tokens.c.id)
        if user is not None:
            query = query.where(tokens.c.user_name == user)
        with self._read() as connection:
            return [_token(row) for row in connection.execute(query)]

    def revoke_token(self, token_id: str, actor: str) -> TokenInfo:
        """Revoke a token: it never authenticates again. Idempotent. Raises :class:`NotFound`."""
        with self._write() as connection:
            row = connection.execute(select(tokens).where(tokens.c.id == token_id)).first()
            if row is None:
                raise NotFound(f"no token {token_id!r}")
            if row.revoked_at is not None:
                return _token(row)
            now = self._now()
            connection.execute(update(tokens).where(tokens.c.id == token_id).values(revoked_at=now))
            self._log(
                connection,
                actor=actor,
                kind="token.revoked",
                details={"user": row.user_name, "token_id": token_id},
            )
            return _token(row, revoked_at=now)

    def authenticate(self, token: str) -> Principal:
        """The principal a bearer token speaks for.

        Raises :class:`AuthenticationError` (one message for every cause) when the token is
        malformed, unknown, revoked or expired, or its user is disabled.
        """
        match = _TOKEN.match(token)
        token_id = match.group(1) if match else ""
        with self._read() as connection:
            row = connection.execute(
                select(tokens, users.c.cluster_admin, users.c.disabled)
                .join(users, users.c.name == tokens.c.user_name)
                .where(tokens.c.id == token_id)
            ).first()
            # Compare even when nothing was found, so a miss costs what a hit costs.
            stored = row.token_hash if row is not None else _DUMMY_HASH
            genuine = hmac.compare_digest(hash_token(token).encode(), stored.encode())
            now = self._now()
            if row is None or not genuine or not _token(row).active(now) or row.disabled:
                raise AuthenticationError("invalid or expired token")
            roles = {
                tenant: Role(role)
                for tenant, role in connection.execute(
                    select(bindings.c.tenant, bindings.c.role).where(
                        bindings.c.user_name == row.user_name
                    )
                )
            }
        if row.last_used_at is None or now - row.last_used_at > _TOUCH_EVERY_S:
            with self._write() as connection:
                connection.execute(
                    update(tokens).where(tokens.c.id == token_id).values(last_used_at=now)
                )
        return Principal(
            user=row.user_name,
            roles=roles,
            cluster_admin=row.cluster_admin,
            token_id=token_id,
            expires_at=row.expires_at,
        )

    def bootstrap_admin(self, name: str = "admin") -> IssuedToken | None:
        """On an empty store, create cluster admin ``name`` and return its first token.

        Idempotent: returns None (and changes nothing) once any user exists.
        """
        with self._read() as connection:
            if connection.execute(select(users.c.name).limit(1)).first() is not None:
                return None
        try:
            self.create_user(name, "system", cluster_admin=True)
        except Conflict:
            return None  # another process bootstrapped first
        return self.create_token(name, "system", description="bootstrap")


def _user_row(connection: Connection, name: str) -> Row[Any]:
    row = connection.execute(select(users).where(users.c.name == name)).first()
    if row is None:
        raise NotFound(f"no user {name!r}")
    return row


def _user(connection: Connection, row: Row[Any]) -> UserRecord:
    roles = connection.execute(
        select(bindings.c.tenant, bindings.c.role).where(bindings.c.user_name == row.name)
    )
    return UserRecord(
        name=row.name,
        created_at=row.created_at,
        cluster_admin=row.cluster_admin,
        disabled=row.disabled,
        roles={tenant: Role(role) for tenant, role in roles},
    )


def _token(row: Row[Any], **changes: Any) -> TokenInfo:
    data = dict(row._mapping) | changes
    return TokenInfo(
        id=data["id"],
        user=data["user_name"],
        created_at=data["created_at"],
        description=data["description"],
        expires_at=data["expires_at"],
        revoked_at=data["revoked_at"],
        last_used_at=data["last_used_at"],
    )
