"""Request dependencies: the runtime and admin authentication."""

from __future__ import annotations

import hmac

from fastapi import Header, HTTPException, Request

from app.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def require_admin(request: Request, authorization: str | None = Header(None)) -> None:
    """Bearer `ADMIN_TOKEN`; the admin API is closed when no token is configured."""
    token = get_runtime(request).settings.admin_token
    if not token:
        raise HTTPException(503, "admin API disabled: set ADMIN_TOKEN")
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
        raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
