"""Request dependencies: the runtime and admin authentication."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import HTTPException, Path, Request

from app.runtime import Runtime
from app.web.admin_auth import admin_failures
from app.web.admin_cookie import COOKIE_NAME, verify_admin_cookie

# Integers a query or path may carry: what the database columns hold (BIGINT, INTEGER);
# a larger one is refused with 422 instead of overflowing in the driver.
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
RowId = Annotated[int, Path(ge=1, le=INT64_MAX, description="A row id.")]


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def require_admin(request: Request) -> None:
    """Bearer `ADMIN_TOKEN` or the dashboard's session cookie; closed when no token is set.

    Cookie-authenticated requests that change something must also carry
    `X-Requested-With` (any value): a cross-site form cannot set it, so the cookie alone
    never authorizes a write even if a browser ignored SameSite. The admin API checks this
    before reading the body too (`app.api.door.Door`).
    """
    token = get_runtime(request).settings.admin_token
    if not token:
        raise HTTPException(503, "admin API disabled: set ADMIN_TOKEN")
    authorization = request.headers.get("authorization")
    failures, client = admin_failures(request)
    await failures.check(client)
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode()):
        return
    if authorization is None and verify_admin_cookie(token, request.cookies.get(COOKIE_NAME)):
        if request.method in ("GET", "HEAD", "OPTIONS") or request.headers.get("x-requested-with"):
            return
        raise HTTPException(403, "cookie-authenticated writes need the X-Requested-With header")
    if authorization is not None:  # a token was tried (no header at all is not a guess)
        await failures.failed(client)
    raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
