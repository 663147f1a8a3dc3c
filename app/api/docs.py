"""`/docs` that works offline: Swagger UI 5's files come from the `swagger-ui-py` package.

FastAPI's default page loads Swagger UI from a CDN, a blank page without internet; ReDoc
(also CDN-only) is not served. Swagger UI 4 (the `swagger-ui-bundle` package) cannot read
the OpenAPI 3.1 document FastAPI writes ("Unable to render this definition"); 5 can.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"


def _package_dir(name: str) -> Path:
    """Where a package's files are, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{name} is not installed (pip install swagger-ui-py)")
    return Path(next(iter(spec.submodule_search_locations)))


# Only the static files of the package are used (its own page handlers are not), so it is
# not imported: its import (Jinja2, urllib) cost every process 0.1-0.2 s of start-up.
SWAGGER_UI_STATIC = _package_dir("swagger_ui") / "static"


def install(app: FastAPI) -> None:
    """Serve `/docs` from local assets; create the app with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_UI_STATIC), name="docs-assets")
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
