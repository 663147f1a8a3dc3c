"""`/docs` in a real browser: Swagger UI renders the OpenAPI 3.1 document and lists the
operations (Swagger UI 4 showed "Unable to render this definition")."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect

from tests.conftest import ServeApp
from tests.support.timing import scaled
from tests.web.conftest import shot

pytestmark = pytest.mark.slow


async def test_the_api_docs_list_the_operations(serve: ServeApp, page: Page) -> None:
    async with serve() as srv:
        await page.goto(f"{srv.url}/docs")
        webhook = page.locator(".opblock-summary-path", has_text="/admin/api/sessions").first
        await expect(webhook).to_be_visible(timeout=scaled(30) * 1000)
        assert await page.locator(".opblock").count() >= 10
        await expect(page.get_by_text("Unable to render this definition")).to_have_count(0)
        await shot(page, "api-docs")
