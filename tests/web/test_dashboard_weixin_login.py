"""The dashboard's personal WeChat login in a real browser: the QR image, then the login stored."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect

from app.channel_records import ChannelRecords
from channels.weixin import login
from tests.channels.weixin.support import wx_settings
from tests.conftest import ADMIN_TOKEN, ServeApp
from tests.fakes import weixin as wx
from tests.fakes.weixin import FakeILink
from tests.support.timing import scaled
from tests.web.conftest import shot

pytestmark = pytest.mark.slow


async def test_the_channels_page_logs_in_with_a_qr_image(serve: ServeApp, page: Page) -> None:
    async with FakeILink() as fake:
        fake.qr_script = ["wait"] * 4 + ["scaned", "confirmed"]
        settings = wx_settings(fake, bot_token=None)
        async with serve(channel_settings={"weixin": settings}) as srv:
            await page.goto(f"{srv.url}/admin")
            await page.fill("#login-token", ADMIN_TOKEN)
            await page.click("#login-form button[type=submit]")
            await expect(page.locator("#nav")).to_be_visible()
            await page.click('#nav a[data-route="channels"]')
            row = page.locator('#channels-table tr[data-channel="weixin"]')
            await expect(row.locator(".badge")).to_have_text("degraded")
            await expect(page.locator("#weixin-login-status")).to_contain_text("not logged in")

            await page.click("#weixin-login")
            image = page.locator("#weixin-qr img")
            await expect(image).to_be_visible()
            await expect(image).to_have_js_property("complete", True)  # loaded (the page's CSP forbids eval)
            assert await image.evaluate("img => img.naturalWidth") > 0
            await expect(page.locator("#weixin-qr")).to_contain_text("qrcode=qr-1")
            await shot(page, "dashboard-weixin-login")
            await expect(page.locator("#weixin-login-status")).to_contain_text(
                "confirmed", timeout=scaled(20) * 1000
            )
            await expect(image).to_have_count(0)
            stored = await login.load(ChannelRecords(srv.runtime.engine, "weixin"), "default")
    assert stored is not None and stored.bot_token == fake.new_token and stored.bot_id == wx.BOT_ID
