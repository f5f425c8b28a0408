"""Errors raised by the store; the API maps each to one HTTP status (noted per class)."""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "Conflict",
    "IdempotencyConflict",
    "LeaseLost",
    "NotFound",
    "StaleState",
    "StoreError",
]


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class NotFound(StoreError):
    """No such object, or it belongs to another tenant (404: existence is not revealed)."""


class Conflict(StoreError):
    """The request contradicts the stored state: a duplicate name, a tenant still in use (409)."""


class IdempotencyConflict(Conflict):
    """An idempotency key was reused with a different spec (409 / 422)."""


class StaleState(Conflict):
    """A job was not in the state the caller expected: someone else moved it first (409)."""


class AuthenticationError(StoreError):
    """A bearer token is malformed, unknown, revoked or expired, or its user is disabled (401).

    The message never says which, so a caller cannot probe tokens.
    """


class LeaseLost(StoreError):
    """A fenced write (or side effect) of a leader whose lease epoch is no longer the store's:
    another control plane took over. Nothing was written; the caller must stop leading. Only the
    leader's fenced store raises it (the API's store is not fenced).
    """
