"""`/docs` that works offline: Swagger UI's files come from the `swagger-ui-bundle` package.

FastAPI's default page loads Swagger UI from a CDN, a blank page without internet; ReDoc
(also CDN-only) is not served.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs-assets"


def install(app: FastAPI) -> None:
    """Serve `/docs` from local assets; create the app with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} — API",
            oauth2_redirect_url=oauth2_redirect,
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

    @app.get(oauth2_redirect, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()
