"""`/docs` works without internet: every file the page loads is served by chatgate itself."""

from __future__ import annotations

import re

import httpx

from tests.conftest import ServeApp


async def test_swagger_ui_loads_only_local_assets(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30, base_url=srv.url) as http:
        page = await http.get("/docs")
        assert page.status_code == 200
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
        urls += re.findall(r"""url: ?["']([^"']+)["']""", page.text)
        assert urls and all(u.startswith("/") for u in urls), urls  # nothing from a CDN
        assert "/docs-assets/swagger-ui-bundle.js" in urls and "/openapi.json" in urls
        for url in urls:
            assert (await http.get(url)).status_code == 200, url
        script = await http.get("/docs-assets/swagger-ui-bundle.js")
        assert "SwaggerUIBundle" in script.text
        assert (await http.get("/redoc")).status_code == 404  # ReDoc needs a CDN: not served
