"""The admin dashboard in a real browser: log in, find a session, read its history, reset it."""

from __future__ import annotations

import httpx
import pytest
from playwright.async_api import Page, expect

from channels.cron import CronSettings
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.support.timing import scaled
from tests.support.webhook import post_webhook
from tests.web.conftest import ignore_expected, shot

pytestmark = pytest.mark.slow


async def _ask(url: str, chat_id: str, text: str) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await post_webhook(
            client, url, WEBHOOK_SECRET, {"chat_id": chat_id, "sender_id": "u1", "text": text}, wait=True
        )
        assert resp.status_code == 200, resp.text


async def test_dashboard_login_history_tool_group_and_reset(serve: ServeApp, page: Page) -> None:
    cron = CronSettings(_env_file=None, tick_seconds=3600)  # type: ignore[call-arg]
    async with serve(channel_settings={"webhook": webhook_settings(), "cron": cron}) as srv:
        await _ask(srv.url, "c1", "what time is it?")
        await _ask(srv.url, "c2", "hello <b>not bold</b>")

        await page.goto(f"{srv.url}/admin")
        await expect(page.locator("#login")).to_be_visible()
        await page.fill("#login-token", "wrong-token")
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("#login-error")).to_have_text("Wrong token.")

        await page.fill("#login-token", ADMIN_TOKEN)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("#nav")).to_be_visible()
        await expect(page.locator('[data-stat="Active sessions"] .v')).to_have_text("2")
        await expect(page.locator(".chart svg")).to_have_count(4)
        await expect(page.locator(".chart rect.bar").first).to_be_attached()
        await shot(page, "dashboard-overview")

        # The cookie is HttpOnly: scripts cannot read it.
        assert await page.evaluate("document.cookie") == ""

        # Sessions: search by message text finds the session with the tool call.
        await page.click('#nav a[data-route="sessions"]')
        await page.fill('input[name="q"]', "what time")
        await page.click(".filters button[type=submit]")
        rows = page.locator("#sessions-table tbody tr")
        await expect(rows).to_have_count(1)
        await expect(rows.first).to_have_attribute("data-key", "webhook:c1")
        await shot(page, "dashboard-sessions")

        await rows.first.locator("a").click()
        await expect(page.locator(".session-head h1")).to_have_text("webhook:c1")
        group = page.locator("#history .toolgroup")
        await expect(group).to_have_count(1)
        await expect(group.locator(".toolcall .name")).to_have_text("current_time")
        await expect(group.locator("pre.result")).to_contain_text("iso")
        roles = await page.locator("#history > .hmsg .who strong").all_inner_texts()
        assert roles == ["user", "assistant"]
        await expect(page.locator("#history > .hmsg.assistant .text")).to_contain_text("It is ")
        await expect(page.locator("#session-status")).to_have_text("active")
        await shot(page, "dashboard-session-history")
        await page.set_viewport_size({"width": 390, "height": 760})
        await shot(page, "dashboard-session-narrow")
        await page.set_viewport_size({"width": 1280, "height": 860})

        await page.click("#action-reset")
        await expect(page.locator("#session-status")).to_have_text("expired", timeout=scaled(10) * 1000)
        await shot(page, "dashboard-session-reset")

        # The next message opens generation 2; generation 1 can be read and reopened.
        await _ask(srv.url, "c1", "after the reset")
        await page.reload()
        await expect(page.locator("#session-status")).to_have_text("active")
        await expect(page.locator("#history .hmsg.user .text")).to_have_text(["after the reset"])
        await page.select_option("#generation-select", "1")
        await expect(page.locator("#history .toolgroup")).to_have_count(1)
        await page.click("#action-reopen")
        await expect(page.locator(".facts")).to_contain_text("generation 1 of 2")
        await expect(page.locator("#session-status")).to_have_text("active")
        await expect(page.locator("#history .hmsg.user .text")).to_have_text(["what time is it?"])

        await page.click("#action-archive")
        await expect(page.locator("#session-status")).to_have_text("archived")
        await page.click('#nav a[data-route="sessions"]')
        await page.select_option('select[name="status"]', "archived")
        await page.click(".filters button[type=submit]")
        await expect(page.locator("#sessions-table tbody tr")).to_have_count(1)
        await expect(page.locator("#sessions-table tbody tr")).to_have_attribute("data-key", "webhook:c1")

        # Markup in messages is shown as text, never rendered.
        await page.goto(f"{srv.url}/admin#/session/{'webhook%3Ac2'}")
        await expect(page.locator("#history .hmsg.user .text")).to_have_text("hello <b>not bold</b>")
        assert await page.locator("#history b").count() == 0

        await page.click('#nav a[data-route="channels"]')
        webhook = page.locator('#channels-table tr[data-channel="webhook"]')
        await expect(webhook.locator(".badge")).to_have_text("ok")
        await shot(page, "dashboard-channels")

        await page.click('#nav a[data-route="runs"]')
        await expect(page.locator("table.grid tbody tr")).to_have_count(3)
        await page.locator("table.grid tbody tr", has_text="current_time").locator("a").first.click()
        await expect(page.locator(".session-head h1")).to_contain_text("Run #")
        await shot(page, "dashboard-run")

        # Cron jobs come from another part's API (/admin/api/cron-jobs); without it the page says so.
        async with httpx.AsyncClient(timeout=30) as client:
            created = await client.post(
                f"{srv.url}/admin/api/cron-jobs",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                json={
                    "name": "morning summary",
                    "prompt": "summarize yesterday",
                    "schedule": "0 9 * * *",
                    "target": {"channel": "webhook", "chat_id": "c1"},
                },
            )
        await page.click('#nav a[data-route="cron"]')
        if created.status_code == 404:
            await expect(page.locator("#cron-missing")).to_be_visible()
        else:
            assert created.status_code == 201, created.text
            job = page.locator("#cron-table tbody tr")
            await expect(job).to_have_count(1)
            await expect(job).to_contain_text("morning summary")
            await expect(job).to_contain_text("0 9 * * *")
            await expect(job.locator("a")).to_have_text("webhook:c1")
        await shot(page, "dashboard-cron")

        await page.click("#logout")
        await expect(page.locator("#login")).to_be_visible()

        errors = ignore_expected(page.errors, r"401", r"Failed to load resource")  # type: ignore[attr-defined]
        assert errors == []


async def test_the_session_page_is_in_chinese(serve: ServeApp, page: Page) -> None:
    """Every text of the session page (facts, history, tool groups, status) in Chinese."""
    async with serve() as srv:
        await _ask(srv.url, "zh1", "what time is it?")
        await page.goto(f"{srv.url}/admin")
        await page.evaluate("localStorage.setItem('chatgate.lang', 'zh')")
        await page.reload()
        await page.fill("#login-token", ADMIN_TOKEN)
        await page.click("#login-form button[type=submit]")
        await expect(page.locator("#nav")).to_be_visible()
        await page.goto(f"{srv.url}/admin#/session/webhook%3Azh1")
        await expect(page.locator("#session-status")).to_have_text("活跃")
        facts = page.locator(".facts")
        await expect(facts).to_contain_text("渠道 webhook")
        await expect(facts).to_contain_text("第 1 代，共 1 代")
        await expect(facts).to_contain_text("条消息")
        await expect(page.locator("#page h2").first).to_contain_text("历史（")
        await expect(page.locator("#history .toolgroup .who strong")).to_have_text("工具调用（1）")
        await expect(page.locator("#history .hmsg.user strong").first).to_have_text("用户")
        text = await page.locator("#page").inner_text()
        for english in ("generation", "messages", "History", "last active", "tool calls", "arguments"):
            assert english not in text, (english, text)
        await shot(page, "dashboard-session-zh")
