"""Issue 22's pages in a real browser (Debian's Chromium, headless), SQLite only, one
browser per test: the chat page (Markdown rendered and sanitised, /new clears the
thread and a reload does not bring it back, a good #token= pasted after a refused one,
CJK font fallback, the offline model streaming) and the dashboard (dark mode, English
and Chinese, live updates, chart axes and tooltips, the redacted configuration, empty
states, the sessions table at 375 px, no "Log out" when the admin API is off).
Screenshots in both languages and both themes go to test-artifacts/web/pages-*.png.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from channels.browser.adapter import BrowserSettings
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.support.db import database
from tests.support.timing import scaled
from tests.support.webhook import post_webhook
from tests.web.conftest import ignore_expected, shot

pytestmark = pytest.mark.slow

TOKEN = "tok-bob-0123456789abcdef"
GATEWAY_TOKENS = [{"token": TOKEN, "subject": "bob", "session_keys": ["web:bob"], "key_prefix": "web:bob:"}]
SAW_STREAMING = """
window.__streamed = [];
new MutationObserver((records) => {
  for (const r of records) {
    const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
    const bubble = el && el.closest && el.closest(".msg.streaming");
    if (bubble) window.__streamed.push(bubble.textContent);
  }
}).observe(document, { childList: true, subtree: true, characterData: true });
"""


@pytest.fixture
async def db_url(tmp_path: Path) -> AsyncIterator[str]:
    """These pages are the same on both backends: SQLite only, to keep the browser tests short."""
    async with database("sqlite", tmp_path) as url:
        yield url


def _serve(serve: ServeApp, **overrides: Any) -> Any:
    return serve(
        channel_settings={"webhook": webhook_settings(), "browser": BrowserSettings(_env_file=None)},  # type: ignore[call-arg]
        gateway_tokens=GATEWAY_TOKENS,
        **overrides,
    )


async def _send(page: Page, text: str) -> None:
    await page.fill("#text", text)
    await page.keyboard.press("Enter")


async def test_chat_markdown_new_token_fonts_and_streaming(serve: ServeApp, page: Page) -> None:
    async with _serve(serve, offline_stream_delay_ms=30) as srv:
        await page.add_init_script(SAW_STREAMING)
        # A refused token, then a good link pasted into the same tab: no reload needed.
        await page.goto(f"{srv.url}/#token=not-a-valid-token")
        await expect(page.locator("#token-error")).to_have_text("The gateway refused this token.")
        await page.evaluate("t => { window.location.hash = `#token=${t}&session=web:bob`; }", TOKEN)
        await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
        await expect(page.locator("#session-select")).to_have_value("web:bob")
        assert TOKEN not in page.url

        # Markdown, rendered; the offline model echoes it, streaming it in pieces.
        await _send(page, "**bold** and `code` and\n\n- one\n- two")
        answer = page.locator(".msg.assistant").last
        await expect(answer.locator("strong")).to_have_text("bold")
        await expect(answer.locator("code")).to_have_text("code")
        await expect(answer.locator("li")).to_have_count(2)
        streamed = await page.evaluate("window.__streamed")
        assert len(set(streamed)) > 2, streamed  # the bubble grew piece by piece

        # Sanitised: markup from a message never runs and never becomes an image or a link to script.
        await _send(
            page,
            '<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
            "[x](javascript:window.__xss=3)",
        )
        await expect(page.locator(".msg.assistant")).to_have_count(2)
        thread = page.locator("#thread")
        assert await thread.locator("img, script").count() == 0
        hrefs = await thread.locator("a").evaluate_all("els => els.map(a => a.getAttribute('href'))")
        assert not any(h and h.startswith("javascript") for h in hrefs), hrefs
        assert await page.evaluate("window.__xss") is None

        # CJK text falls back to a system CJK font.
        await _send(page, "你好，世界")
        await expect(page.locator(".msg.assistant").last).to_contain_text("你好，世界")
        family = await page.evaluate("getComputedStyle(document.body).fontFamily")
        assert "Noto Sans CJK SC" in family and "Microsoft YaHei" in family and "PingFang SC" in family
        await shot(page, "pages-chat-light")
        await page.emulate_media(color_scheme="dark")
        await shot(page, "pages-chat-dark")
        await page.emulate_media(color_scheme="light")

        # /new clears the thread; a reload does not show the ended conversation again.
        await _send(page, "/new")
        await expect(page.locator(".msg")).to_have_count(0)
        await expect(page.locator(".notice").last).not_to_have_text("")
        await page.reload()
        await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
        await expect(page.locator(".notice")).to_contain_text(["has ended"])
        assert await page.locator(".msg").count() == 0
        # ... and the next message opens the new conversation.
        await _send(page, "fresh start")
        await expect(page.locator(".msg.assistant")).to_have_text(["You said: fresh start"])
        # Chromium reports the refused token's close, the missing favicon, and a CSP
        # "inline event handler" violation while DOMPurify parses the `onerror` message in
        # its inert DOMParser document (nothing runs there: the checks above hold).
        expected = (r"WebSocket", r"4001", r"status of 404", r"inline event handler")
        left = ignore_expected(page.errors, *expected)  # type: ignore[attr-defined]
        assert left == [], "\n".join(left)


async def _login(page: Page, url: str) -> None:
    await page.goto(f"{url}/admin")
    await page.fill("#login-token", ADMIN_TOKEN)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#nav")).to_be_visible()


async def test_dashboard_theme_language_live_charts_config_empty_and_mobile(
    serve: ServeApp, browser: Browser
) -> None:
    async with _serve(serve, llm_api_key="sk-never-shown-1234") as srv:
        context = await browser.new_context(viewport={"width": 1280, "height": 860}, locale="en-US")
        page = await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        await _login(page, srv.url)

        # Empty pages explain themselves.
        for route, empty in [
            ("sessions", "sessions"),
            ("runs", "runs"),
            ("approvals", "approvals"),
            ("cron", "cron"),
            ("dead-letters", "dead-letters"),
        ]:
            await page.goto(f"{srv.url}/admin#/{route}")
            guide = page.locator(f"[data-empty='{empty}']")
            await expect(guide).to_be_visible()
            assert len(await guide.inner_text()) > 40

        # Live: a message arriving elsewhere shows up on the open sessions page by itself.
        await page.goto(f"{srv.url}/admin#/sessions")
        await expect(page.locator("#live")).to_have_attribute("data-on", "1")
        async with httpx.AsyncClient(timeout=30) as client:
            payload = {"chat_id": "c1", "sender_id": "u1", "text": "what time is it?"}
            assert (
                await post_webhook(client, srv.url, WEBHOOK_SECRET, payload, wait=True)
            ).status_code == 200
        await expect(page.locator("#sessions-table tbody tr")).to_have_count(1, timeout=scaled(15) * 1000)

        # Charts: axes with labels, a tooltip under the pointer.
        await page.goto(f"{srv.url}/admin#/overview?minutes=15")
        chart = page.locator(".chart").first
        await expect(chart.locator(".yaxis span")).to_have_count(3)
        await expect(chart.locator(".xaxis span").last).to_contain_text("UTC")
        await chart.locator("svg").hover()
        await expect(chart.locator(".chart-tip")).to_be_visible()
        await expect(chart.locator(".chart-tip")).to_contain_text("UTC")

        # Configuration: read-only, secrets redacted.
        await page.goto(f"{srv.url}/admin#/config")
        await expect(page.locator("[data-setting='LLM_API_KEY']")).to_contain_text("••••••")
        await expect(page.locator("[data-setting='ADMIN_TOKEN']")).to_contain_text("••••••")
        await expect(page.locator("[data-setting='LLM_PROVIDER']")).to_contain_text("offline")
        content = await page.content()
        assert "sk-never-shown-1234" not in content and ADMIN_TOKEN not in content

        # Screenshots: both languages, both themes.
        for lang in ("en", "zh"):
            for theme in ("light", "dark"):
                await page.evaluate(
                    "([l, t]) => { localStorage.setItem('chatgate.lang', l); "
                    "localStorage.setItem('chatgate.theme', t); }",
                    [lang, theme],
                )
                for route in ("overview", "sessions", "config"):
                    await page.goto(f"{srv.url}/admin#/{route}")
                    await page.reload()
                    await expect(page.locator("html")).to_have_attribute("data-effective-theme", theme)
                    await expect(page.locator("#page h1")).to_be_visible()
                    await shot(page, f"pages-dashboard-{route}-{lang}-{theme}")
        # Chinese, remembered: the nav and the page are in Chinese after the reload above.
        await expect(page.locator("#nav a[data-route='sessions']")).to_have_text("会话")
        await expect(page.locator("#page h1")).to_have_text("配置")
        # Switch back by the buttons, and they are remembered.
        await page.click("#lang")
        await expect(page.locator("#nav a[data-route='sessions']")).to_have_text("Sessions")
        await page.click("#theme")
        await expect(page.locator("html")).to_have_attribute("data-theme", "light")
        await page.reload()
        await expect(page.locator("#nav a[data-route='sessions']")).to_have_text("Sessions")
        await expect(page.locator("html")).to_have_attribute("data-effective-theme", "light")

        # 375 px wide: the sessions table fits and every row is readable.
        await page.set_viewport_size({"width": 375, "height": 800})
        await page.goto(f"{srv.url}/admin#/sessions")
        row = page.locator("#sessions-table tbody tr").first
        await expect(row).to_be_visible()
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 376, width
        box = await row.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 376
        await shot(page, "pages-dashboard-sessions-375")
        await context.close()
        assert errors == []

        # A browser whose language is Chinese and whose system is dark gets both at once.
        context = await browser.new_context(locale="zh-CN", color_scheme="dark")
        page = await context.new_page()
        await _login(page, srv.url)
        await expect(page.locator("#nav a[data-route='overview']")).to_have_text("概览")
        await expect(page.locator("html")).to_have_attribute("data-effective-theme", "dark")
        bg = await page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert bg == "rgb(18, 21, 27)", bg
        # Detail pages too: a session's actions and the channels table speak Chinese.
        await page.goto(f"{srv.url}/admin#/sessions")
        await page.locator("#sessions-table tbody tr a").first.click()
        await expect(page.locator("#action-reset")).to_have_text("重置")
        await expect(page.locator("#action-archive")).to_have_text("归档")
        await page.goto(f"{srv.url}/admin#/channels")
        await expect(page.locator("#page thead")).to_contain_text("健康状态")
        await shot(page, "pages-dashboard-channels-zh-dark")
        await context.close()


async def test_no_log_out_when_the_admin_api_is_off(serve: ServeApp, page: Page) -> None:
    async with serve(admin_token=None) as srv:
        await page.goto(f"{srv.url}/admin")
        await expect(page.locator("#page")).to_contain_text("ADMIN_TOKEN")
        await expect(page.locator("#logout")).to_be_hidden()
        await expect(page.locator("#nav")).to_be_hidden()
        await expect(page.locator("#login")).to_be_hidden()
