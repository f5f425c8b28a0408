"""Limits on what one token, one tenant or one client address may ask for: job submissions per
token and per tenant, failed authentications per client address and per token id (moving
windows of the ``limits`` library, in this process's memory), and jobs PENDING per tenant.

Over a limit the request is refused with 429, a ``Retry-After`` header (whole seconds) and a
message that says which limit. Each server process counts on its own: behind several servers
(a standby, ``uvicorn --workers``), a client may get up to that many times each rate.
"""

from __future__ import annotations

import math
import re
import threading
import time
from typing import Any

from fastapi import HTTPException, status
from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

__all__ = ["PENDING_RETRY_S", "Limits", "too_many"]

#: What a 429 for a full queue asks the client to wait: the queue drains as the scheduler runs.
PENDING_RETRY_S = 5
#: How long a tenant's PENDING count read from the store is trusted (submissions through this
#: server are added to it meanwhile; jobs that leave the queue are seen at the next read).
PENDING_READ_EVERY_S = 1.0
_TOKEN_ID = re.compile(r"^aic_([0-9a-f]{12})_")


def too_many(message: str, retry_after_s: float) -> HTTPException:
    """A 429 saying ``message``, with ``Retry-After`` (at least 1 s)."""
    seconds = max(1, math.ceil(retry_after_s))
    return HTTPException(
        status.HTTP_429_TOO_MANY_REQUESTS,
        detail=f"{message}; retry in {seconds} s",
        headers={"Retry-After": str(seconds)},
    )


def _items(rate: str) -> list[RateLimitItem]:
    return list(parse_many(rate)) if rate.strip() else []


class Limits:
    """The limits of one server (``app.state.limits``), read from its settings. Thread-safe."""

    def __init__(self, settings: Any) -> None:
        self._window = MovingWindowRateLimiter(MemoryStorage())
        self._submit_token = _items(settings.submit_rate_per_token)
        self._submit_tenant = _items(settings.submit_rate_per_tenant)
        self._login_address = _items(settings.failed_logins_per_address)
        self._login_token = _items(settings.failed_logins_per_token)
        self.max_pending = int(settings.max_pending_per_tenant)
        self._pending: dict[str, tuple[int, float]] = {}
        self._pending_lock = threading.Lock()

    # -- moving windows ---------------------------------------------------------------------

    def _wait_s(self, items: list[RateLimitItem], *key: str) -> float | None:
        """Seconds until every window of ``items`` has room for one more under ``key``; None
        when they all have room now."""
        waits = []
        for item in items:
            if not self._window.test(item, *key):
                reset, _remaining = self._window.get_window_stats(item, *key)
                waits.append(reset - time.time())
        return max(waits) if waits else None

    def _take(self, items: list[RateLimitItem], what: str, *key: str) -> None:
        """Count one request under ``key`` in every window, or raise 429 if one is full."""
        wait = self._wait_s(items, *key)
        if wait is None:
            for item in items:
                if not self._window.hit(item, *key):  # a concurrent request took the room
                    wait = 1.0
                    break
        if wait is not None:
            rates = ", ".join(str(item) for item in items)
            raise too_many(f"too many {what} (at most {rates})", wait)

    def submission_by_token(self, token: str) -> None:
        """Count a job submission made with ``token`` (its id: ``Principal.token_id``)."""
        self._take(self._submit_token, "job submissions with this token", "submit-token", token)

    def submission_for_tenant(self, tenant: str) -> None:
        """Count a job submission to ``tenant`` (call once the caller may submit there)."""
        self._take(
            self._submit_tenant, f"job submissions to tenant {tenant!r}", "submit-tenant", tenant
        )

    # -- failed authentications -------------------------------------------------------------

    def _login_keys(self, address: str, token: str) -> list[tuple[list[RateLimitItem], str, str]]:
        keys = [(self._login_address, "failed sign-ins from this address", address)]
        match = _TOKEN_ID.match(token)
        if match:
            keys.append((self._login_token, "failed sign-ins with this token id", match[1]))
        return keys

    def check_login(self, address: str, token: str) -> None:
        """429 while ``address``, or the id ``token`` claims, has failed too often lately."""
        for items, what, key in self._login_keys(address, token):
            wait = self._wait_s(items, "login", key)
            if wait is not None:
                rates = ", ".join(str(item) for item in items)
                raise too_many(f"too many {what} (at most {rates})", wait)

    def login_failed(self, address: str, token: str) -> None:
        """Count a token that did not authenticate, against its address and claimed id."""
        for items, _what, key in self._login_keys(address, token):
            for item in items:
                self._window.hit(item, "login", key)

    # -- pending jobs -----------------------------------------------------------------------

    def admit_pending(self, store: Any, tenant: str) -> None:
        """Count one more PENDING job of ``tenant``, or raise 429 when it has
        :attr:`max_pending` already. The count is the store's, read at most every
        :data:`PENDING_READ_EVERY_S`, plus the submissions admitted here since."""
        if self.max_pending <= 0:
            return
        now = time.monotonic()
        with self._pending_lock:
            known = self._pending.get(tenant)
        read = None
        if known is None or now - known[1] > PENDING_READ_EVERY_S:
            read = (int(store.pending_count(tenant)), now)
        with self._pending_lock:
            known = self._pending.get(tenant)  # again: other requests may have counted
            if read is not None and (known is None or known[1] < read[1]):
                known = read
            assert known is not None
            if known[0] >= self.max_pending:
                self._pending[tenant] = known
                raise too_many(
                    f"tenant {tenant!r} has {known[0]} jobs waiting, the most this cluster "
                    f"queues for one tenant ({self.max_pending}); submit more once some have "
                    "started or been cancelled",
                    PENDING_RETRY_S,
                )
            self._pending[tenant] = (known[0] + 1, known[1])
