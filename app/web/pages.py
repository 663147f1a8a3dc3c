"""Routes of the browser pages: `/` (chat), `/admin` (dashboard), admin login/logout.

The HTML files are static; they are served with a strict Content-Security-Policy (only
this origin's scripts, styles and sockets), so nothing a chat message contains can run
as code even if a rendering bug slipped through.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, HTTPException, Request, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from app.runtime import Runtime
from app.web.admin_auth import admin_failures
from app.web.admin_cookie import COOKIE_NAME, COOKIE_PATH, DEFAULT_TTL_SECONDS, sign_admin_cookie

STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/ui"

_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter()


def security_headers() -> dict[str, str]:
    """The headers every page is served with (for pages other modules serve)."""
    return dict(_SECURITY_HEADERS)


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html", headers=_SECURITY_HEADERS)


@router.get("/", include_in_schema=False)
async def chat_page() -> FileResponse:
    """The web chat page (talks to the gateway at /ws)."""
    return _page("chat.html")


@router.get("/admin", include_in_schema=False)
async def admin_page() -> FileResponse:
    """The admin dashboard (a single page; data comes from /admin/api/…)."""
    return _page("admin.html")


@router.get("/admin/", include_in_schema=False)
async def admin_page_slash() -> RedirectResponse:
    return RedirectResponse("/admin", status_code=308)


async def _given_token(request: Request) -> str:
    body = await request.body()
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        try:
            data = json.loads(body or b"{}")
        except (ValueError, RecursionError):
            raise HTTPException(400, "malformed JSON") from None
        token = data.get("token") if isinstance(data, dict) else None
    elif content_type == "application/x-www-form-urlencoded":
        values = parse_qs(body.decode("utf-8", "replace")).get("token")
        token = values[0] if values else None
    else:
        raise HTTPException(415, 'send the token as JSON {"token": …} or as a form field')
    if not isinstance(token, str) or not token:
        raise HTTPException(400, "token is required")
    return token


@router.post("/admin/login", tags=["admin dashboard"])
async def admin_login(request: Request) -> Response:
    """Exchange ADMIN_TOKEN for the dashboard's session cookie.

    Body: JSON `{"token": "<ADMIN_TOKEN>"}` (answered `200 {"ok": true}`) or a form field
    `token` (answered with a redirect to `/admin`). The cookie is HttpOnly,
    SameSite=Strict, limited to `/admin`, and valid for 12 hours.
    """
    runtime: Runtime = request.app.state.runtime
    admin_token = runtime.settings.admin_token
    if not admin_token:
        raise HTTPException(503, "admin API disabled: set ADMIN_TOKEN")
    failures, client = admin_failures(request)
    await failures.check(client)
    given = await _given_token(request)
    if not hmac.compare_digest(given.encode(errors="surrogatepass"), admin_token.encode()):
        await failures.failed(client)
        raise HTTPException(401, "wrong admin token")
    is_form = request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded")
    response: Response = (
        RedirectResponse("/admin", status_code=303) if is_form else JSONResponse({"ok": True})
    )
    response.set_cookie(
        COOKIE_NAME,
        sign_admin_cookie(admin_token),
        max_age=DEFAULT_TTL_SECONDS,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> FileResponse:
    """Browsers ask for it on every page; the SVG icon the pages also link."""
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")


@router.post("/admin/logout", tags=["admin dashboard"])
async def admin_logout() -> Response:
    """Drop the dashboard's session cookie."""
    response = JSONResponse({"ok": True})
    response.delete_cookie(COOKIE_NAME, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


def install(app: FastAPI) -> None:
    """Add the pages and their static files (`/ui/…`) to the app."""
    app.include_router(router)
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="web-static")
