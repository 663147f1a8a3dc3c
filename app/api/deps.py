"""Request dependencies: the runtime and admin authentication."""

from __future__ import annotations

import hmac
import math
import time
from collections import deque

from fastapi import Header, HTTPException, Request

from app.runtime import Runtime
from app.web.admin_cookie import COOKIE_NAME, verify_admin_cookie


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


class FailedAdminAuth:
    """Wrong admin tokens per client address: after `limit` within `window` seconds the
    address gets 429 (even with the right token) until the window has passed.

    Kept per process, in memory: with several replicas an attacker gets `limit` tries per
    replica per window, which still makes guessing a long random token hopeless. Behind
    a reverse proxy the client address must be the real one (uvicorn's proxy headers).
    """

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client)
        if times is None:
            return deque()
        while times and now - times[0] >= self.window:
            times.popleft()
        if not times:
            del self._failures[client]
        return times

    def check(self, client: str) -> None:
        now = time.monotonic()
        times = self._recent(client, now)
        if len(times) >= self.limit:
            retry = max(1, math.ceil(self.window - (now - times[0])))
            raise HTTPException(
                429,
                f"too many wrong admin tokens from this address; retry in {retry} s",
                headers={"Retry-After": str(retry)},
            )

    def failed(self, client: str) -> None:
        if len(self._failures) > 10_000:  # bounded: forget the oldest addresses
            for stale in list(self._failures)[:1000]:
                del self._failures[stale]
        self._failures.setdefault(client, deque()).append(time.monotonic())


def admin_failures(request: Request) -> tuple[FailedAdminAuth, str]:
    """The app's failed-token record (made by `create_app`) and this request's client address."""
    record: FailedAdminAuth = request.app.state.admin_failures
    return record, request.client.host if request.client else "unknown"


def require_admin(request: Request, authorization: str | None = Header(None)) -> None:
    """Bearer `ADMIN_TOKEN` or the dashboard's session cookie; closed when no token is set.

    Cookie-authenticated requests that change something must also carry
    `X-Requested-With` (any value): a cross-site form cannot set it, so the cookie alone
    never authorizes a write even if a browser ignored SameSite.
    """
    token = get_runtime(request).settings.admin_token
    if not token:
        raise HTTPException(503, "admin API disabled: set ADMIN_TOKEN")
    failures, client = admin_failures(request)
    failures.check(client)
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
        return
    if authorization is None and verify_admin_cookie(token, request.cookies.get(COOKIE_NAME)):
        if request.method in ("GET", "HEAD", "OPTIONS") or request.headers.get("x-requested-with"):
            return
        raise HTTPException(403, "cookie-authenticated writes need the X-Requested-With header")
    if authorization is not None:  # a token was tried (no header at all is not a guess)
        failures.failed(client)
    raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
