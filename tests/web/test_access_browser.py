"""The dashboard's access page in a real browser: approve a pairing code, allow and remove
a sender; the webhook's sender is answered once approved."""

from __future__ import annotations

import httpx
import pytest
from playwright.async_api import Page, expect

from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.support.webhook import post_webhook
from tests.web.conftest import ignore_expected, shot

pytestmark = pytest.mark.slow


async def test_access_page_approves_and_edits(serve: ServeApp, page: Page) -> None:
    channel = webhook_settings(access="pairing")
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=30) as http:

        async def send(sender: str) -> dict[str, object]:
            body = {"chat_id": f"dm-{sender}", "sender_id": sender, "text": "hello"}
            return (await post_webhook(http, srv.url, WEBHOOK_SECRET, body, wait=True)).json()

        assert (await send("gina"))["reason"] == "pairing"

        await page.goto(f"{srv.url}/admin")
        await page.fill("#login-token", ADMIN_TOKEN)
        await page.click("#login-form button[type=submit]")
        await page.click('#nav a[href="/admin/access"]')
        pending = page.locator("#access-pending tbody tr")
        await expect(pending).to_have_count(1)
        await expect(pending.first).to_contain_text("gina")
        await shot(page, "dashboard-access")
        await pending.first.locator("button").click()
        await expect(page.locator("#access-entries tbody tr")).to_have_count(1)
        await expect(page.locator("#access-pending")).to_have_count(0)
        assert not (await send("gina")).get("skipped")

        await page.fill('#access-add input[name="id"]', "hank")
        await page.click("#access-add button[type=submit]")
        # The page says what the server answered: an error shows here, not as a row missing.
        await expect(page.locator("#access-message")).to_contain_text("Allowed hank")
        rows = page.locator("#access-entries tbody tr")
        await expect(rows).to_have_count(2)
        assert not (await send("hank")).get("skipped")
        await rows.filter(has_text="hank").locator("button").click()
        await expect(rows).to_have_count(1)
        assert (await send("hank"))["reason"] == "pairing"
        # Before signing in the dashboard's first requests get 401; favicon 404: not the page's.
        assert ignore_expected(page.errors, r"Failed to load resource") == []  # type: ignore[attr-defined]
