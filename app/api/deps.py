"""Request dependencies: the runtime and admin authentication."""

from __future__ import annotations

import hmac

from fastapi import Header, HTTPException, Request

from app.runtime import Runtime
from app.web.admin_cookie import COOKIE_NAME, verify_admin_cookie


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def require_admin(request: Request, authorization: str | None = Header(None)) -> None:
    """Bearer `ADMIN_TOKEN` or the dashboard's session cookie; closed when no token is set.

    Cookie-authenticated requests that change something must also carry
    `X-Requested-With` (any value): a cross-site form cannot set it, so the cookie alone
    never authorizes a write even if a browser ignored SameSite.
    """
    token = get_runtime(request).settings.admin_token
    if not token:
        raise HTTPException(503, "admin API disabled: set ADMIN_TOKEN")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
        return
    if authorization is None and verify_admin_cookie(token, request.cookies.get(COOKIE_NAME)):
        if request.method in ("GET", "HEAD", "OPTIONS") or request.headers.get("x-requested-with"):
            return
        raise HTTPException(403, "cookie-authenticated writes need the X-Requested-With header")
    raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
