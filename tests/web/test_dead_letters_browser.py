"""The dashboard's dead-letters page in a real browser: see a failed event, retry it."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import Page, expect
from sqlalchemy import select

from app.db.models import inbox
from app.events import InboundEvent
from tests.app.test_dead_letters import BrokenWhile
from tests.conftest import ADMIN_TOKEN, ServeApp
from tests.web.conftest import shot

pytestmark = pytest.mark.slow


async def test_dead_letters_page_lists_and_retries(serve: ServeApp, page: Page) -> None:
    model = BrokenWhile({"boom", "bust"})
    async with serve(provider=model, max_event_attempts=1) as srv:
        events = [InboundEvent.from_text("webhook", "c", "u", t) for t in ("boom", "bust")]
        for event in events:
            await srv.runtime.ingest.submit([event])
        for event in events:
            assert (await srv.runtime.waiters.wait_for_replies(event.event_id, 30)).done

        await page.goto(f"{srv.url}/admin#/dead-letters")
        await page.fill("#login-token", ADMIN_TOKEN)
        await page.click("#login-form button[type=submit]")
        rows = page.locator("#dead-letters-table tbody tr")
        await expect(rows).to_have_count(2)
        await expect(rows.first).to_contain_text("model broke")
        await shot(page, "dashboard-dead-letters")

        model.broken.clear()
        boom = rows.filter(has_text="boom")
        await boom.locator("button.retry").click()
        await expect(rows).to_have_count(1)
        await rows.first.locator("button.discard").click()
        await expect(page.locator("[data-empty='dead-letters']")).to_contain_text("No dead letters")

        async with asyncio.timeout(15):
            while True:
                async with srv.runtime.engine.connect() as conn:
                    states = dict((await conn.execute(select(inbox.c.event_id, inbox.c.status))).all())
                if states[events[0].event_id] == "done":
                    break
                await asyncio.sleep(0.1)
        assert states[events[1].event_id] == "discarded"
