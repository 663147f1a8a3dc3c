"""The dashboard's usage page in a real browser (Debian's Chromium, headless), SQLite only
like the other page tests: after real model calls through the server (a fake model that
reports usage) the page shows their numbers, a bar per day in the tokens chart, the top
senders, the budgets' use as bars, the channel filter, and Chinese. Earlier days are rows
written straight into `usage_records` (as a running deployment would have written them on
those days): the server's clock cannot be moved back for a real call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Page, expect
from sqlalchemy import insert

from app.db.models import usage_records
from tests.channels.support import llm_settings
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, text
from tests.support.db import database
from tests.support.webhook import post_webhook
from tests.web.conftest import ignore_expected, shot

pytestmark = pytest.mark.slow

PRICES = {"fake-model": {"input": 1.0, "output": 2.0}}  # per million tokens
BUDGETS = [
    {"scope": "deployment", "period": "month", "tokens": 100_000},
    {"scope": "sender", "period": "day", "tokens": 1000},
]


@pytest.fixture
async def db_url(tmp_path: Path) -> AsyncIterator[str]:
    async with database("sqlite", tmp_path) as url:
        yield url


def _day(days_ago: int) -> str:
    return (datetime.now(UTC) - timedelta(days=days_ago)).strftime("%Y-%m-%d")


def _earlier(days_ago: int, tokens_in: int, tokens_out: int) -> dict[str, object]:
    return dict(
        day=_day(days_ago),
        session_key="telegram:42",
        identity="telegram:42",
        chat="telegram:42",
        channel="telegram",
        agent="default",
        model="fake-model",
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        cached_tokens=0,
        audio_seconds=0.0,
        cost=(tokens_in * 1.0 + tokens_out * 2.0) / 1_000_000,
        currency="USD",
        created_at=datetime.now(UTC) - timedelta(days=days_ago),
    )


async def _bar_heights(page: Page) -> list[float]:
    bars = page.locator("#usage-tokens-chart svg rect.bar")
    return [float(h or 0) for h in await bars.evaluate_all("els => els.map(e => e.getAttribute('height'))")]


async def test_the_usage_page_shows_real_calls_per_day_top_senders_and_budgets(
    serve: ServeApp, page: Page, tmp_path: Path
) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(
            text("one", prompt_tokens=300, completion_tokens=20),
            text("two", prompt_tokens=100, completion_tokens=10),
        )
        async with (
            serve(
                **llm_settings(fake),
                channel_settings={"webhook": webhook_settings()},
                usage_prices=PRICES,
                usage_budgets=BUDGETS,
            ) as srv,
            httpx.AsyncClient(timeout=60) as client,
        ):
            for sender, said in (("ann", "hi"), ("bob", "hello")):
                payload = {"chat_id": sender, "sender_id": sender, "text": said}
                resp = await post_webhook(client, srv.url, WEBHOOK_SECRET, payload, wait=True)
                assert resp.status_code == 200, resp.text
            assert len(fake.requests) == 2
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(insert(usage_records), [_earlier(3, 1000, 100), _earlier(1, 500, 50)])

            await page.goto(f"{srv.url}/admin")
            await page.fill("#login-token", ADMIN_TOKEN)
            await page.click("#login-form button[type=submit]")
            await expect(page.locator("#nav")).to_be_visible()
            await page.click("#nav a[data-route='usage']")
            await expect(page.locator("#page h1")).to_have_text("Usage")
            await expect(page.locator("[data-empty='usage']")).to_have_count(0)

            # Last 30 days by default: 4 calls, 1900 in, 180 out, cost from USAGE_PRICES.
            cards = page.locator("#usage-cards")
            await expect(cards.locator("[data-stat='Model calls'] .v")).to_have_text("4")
            await expect(cards.locator("[data-stat='Input tokens'] .v")).to_have_text("1,900")
            await expect(cards.locator("[data-stat='Output tokens'] .v")).to_have_text("180")
            cost = (1900 * 1.0 + 180 * 2.0) / 1_000_000
            await expect(cards.locator("[data-stat='Cost'] .v")).to_have_text(f"{cost:.6f} USD")

            # A week: one bar per day; drawn for 3 days ago, yesterday and today only.
            await page.select_option("#usage-days", "7")
            await expect(page.locator("#usage-tokens-chart svg rect.bar")).to_have_count(7)
            heights = await _bar_heights(page)
            drawn = [i for i, h in enumerate(heights) if h > 0]
            assert drawn == [3, 5, 6], heights  # 3 days ago, yesterday, today
            assert heights[3] > heights[5] > heights[6]  # 1100 > 550 > 430 tokens
            await expect(page.locator("#usage-tokens-chart .xaxis span").last).to_have_text(
                f"{_day(0)[5:]} UTC"
            )
            chart = page.locator("#usage-tokens-chart svg")
            await chart.focus()  # the tooltip names the last day and its tokens
            await expect(page.locator("#usage-tokens-chart .chart-tip")).to_have_text(f"{_day(0)} UTC · 430")
            # The cost chart has a point for each of the seven days.
            await expect(page.locator("#usage-cost-chart svg path.line")).to_have_count(1)

            # Top senders: the seeded Telegram user first, then ann, then bob.
            senders = page.locator("#usage-top-sender tbody tr")
            await expect(senders).to_have_count(3)
            keys = await senders.evaluate_all("rows => rows.map(r => [r.dataset.key, r.dataset.tokens])")
            assert keys == [["telegram:42", "1650"], ["webhook:ann", "320"], ["webhook:bob", "110"]]
            await expect(page.locator("#usage-top-session tbody tr")).to_have_count(3)
            model_cells = page.locator("#usage-top-model tbody tr td")
            await expect(model_cells).to_have_text(["fake-model", "4", "1,900 / 180", "—", "0.002260 USD"])

            # Budgets: the deployment's month, and the senders' day (today's callers only).
            deployment = page.locator("#usage-budgets [data-scope='deployment'] .budget-row")
            await expect(deployment).to_have_count(1)
            share = float(await deployment.get_attribute("data-share") or 0)
            month_tokens = 430 + sum(t for d, t in ((3, 1100), (1, 550)) if _day(d)[:7] == _day(0)[:7])
            assert share == pytest.approx(month_tokens / 100_000, abs=1e-4)
            per_sender = page.locator("#usage-budgets [data-scope='sender'] .budget-row")
            await expect(per_sender).to_have_count(2)
            shares = await per_sender.evaluate_all("rs => rs.map(r => [r.dataset.subject, r.dataset.share])")
            assert shares == [["webhook:ann", "0.32"], ["webhook:bob", "0.11"]]
            fill = per_sender.first.locator("rect.fill")
            assert float(await fill.get_attribute("width") or 0) == pytest.approx(0.32 * 300, abs=0.1)
            await shot(page, "usage-en-light")
            path = tmp_path / "usage-en.png"
            path.write_bytes(await page.screenshot(full_page=True))
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            # A channel without calls explains the empty page.
            await page.goto(f"{srv.url}/admin#/usage?days=7&channel=slack")
            await expect(page.locator("[data-empty='usage']")).to_be_visible()
            await expect(cards.locator("[data-stat='Model calls'] .v")).to_have_text("0")
            await page.goto(f"{srv.url}/admin#/usage?days=7")
            await expect(cards.locator("[data-stat='Model calls'] .v")).to_have_text("4")

            # One channel: only the webhook's two calls, only today's bar.
            await page.select_option("#usage-channel", "webhook")
            await expect(cards.locator("[data-stat='Model calls'] .v")).to_have_text("2")
            await expect(page.locator("#usage-top-sender tbody tr")).to_have_count(2)
            heights = await _bar_heights(page)
            assert [i for i, h in enumerate(heights) if h > 0] == [6], heights
            assert "channel=webhook" in page.url and "days=7" in page.url

            # Chinese.
            await page.click("#lang")
            await expect(page.locator("#page h1")).to_have_text("用量")
            await expect(page.locator("#nav a[data-route='usage']")).to_have_text("用量")
            await expect(cards.locator("[data-stat='Model calls'] .k")).to_have_text("模型调用")
            await page.screenshot(path=str(tmp_path / "usage-zh.png"), full_page=True)
            await shot(page, "usage-zh-light")
    left = ignore_expected(page.errors, r"status of 401")  # type: ignore[attr-defined]
    assert left == [], "\n".join(left)
