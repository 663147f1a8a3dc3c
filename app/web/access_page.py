"""The dashboard's access page, `/admin/access`: a static page of its own (`static/access.js`)
that talks to `/admin/api/access…` with the dashboard's session cookie."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse

from app.web.pages import STATIC_DIR, security_headers

router = APIRouter()


@router.get("/admin/access", include_in_schema=False)
async def access_page() -> FileResponse:
    """Pairing codes waiting for approval, the stored allowlists, each channel's mode."""
    return FileResponse(STATIC_DIR / "access.html", media_type="text/html", headers=security_headers())
