"""Quotas through the signed webhook on both backends: over the limit the sender is told
once per window and the model is not called; the counts live in the database."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access import QuotaCounters
from app.db.models import access_counters
from tests.access.support import MeteredModel, texts, until
from tests.conftest import WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes.http_receiver import HttpReceiver
from tests.support.webhook import post_webhook

T0 = 1_800_057_600.0  # the start of a UTC day (and of a minute): the windows are fixed here


def at(runtime: Any, seconds: float) -> None:
    """Set the clock the quotas count by (the windows, not any timing of the test)."""
    runtime.access.clock = lambda: T0 + seconds


async def _send(http: httpx.AsyncClient, url: str, sender: str, text: str, chat: str | None = None) -> Any:
    body: dict[str, Any] = {"chat_id": chat or f"dm-{sender}", "sender_id": sender, "text": text}
    if chat is not None:
        body["chat_type"] = "group"
    resp = await post_webhook(http, url, WEBHOOK_SECRET, body, wait=True)
    assert resp.status_code in (200, 202), resp.text
    return resp.json()


async def _tokens(runtime: Any, subject_part: str) -> int:
    async with runtime.engine.connect() as conn:
        rows = await conn.execute(
            select(access_counters.c.subject, access_counters.c.count).where(
                access_counters.c.metric == "tokens"
            )
        )
        return sum(int(n) for subject, n in rows if subject_part in subject)


async def test_messages_per_minute_one_notice_and_no_model_call(serve: ServeApp) -> None:
    model = MeteredModel()
    async with HttpReceiver() as receiver:
        channel = webhook_settings(quota_sender_messages_per_minute=2, callback_url=receiver.url)
        async with (
            serve(channel_settings={"webhook": channel}, provider=model) as srv,
            httpx.AsyncClient(timeout=30) as http,
        ):
            at(srv.runtime, 1)
            answers = [await _send(http, srv.url, "ann", f"m{i}") for i in range(4)]
            assert [a.get("reason") for a in answers] == [None, None, "quota", "quota"]
            assert "notice" in answers[2] and "notice" not in answers[3]  # once per window
            assert model.calls == ["m0", "m1"]
            got = texts(await receiver.wait_for(3))
            assert sorted(got) == sorted(["echo m0", "echo m1", answers[2]["notice"]])
            assert "too fast" in answers[2]["notice"]
            # Another sender has a count of their own; the next minute starts again.
            assert (await _send(http, srv.url, "ben", "b0")).get("reason") is None
            at(srv.runtime, 61)
            assert (await _send(http, srv.url, "ann", "m4")).get("reason") is None
            assert model.calls == ["m0", "m1", "b0", "m4"]
            assert len(await receiver.wait_for(5)) == 5


async def test_session_quota_counts_everyone_in_a_group_and_the_agent_limit(
    serve: ServeApp, tmp_path: Path
) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text("agents:\n  - name: helper\n    quota_session_messages_per_minute: 3\n")
    channel = webhook_settings(quota_session_messages_per_minute=5, locale="zh")
    async with (
        serve(channel_settings={"webhook": channel}, agents_file=str(agents)) as srv,
        httpx.AsyncClient(timeout=30) as http,
    ):
        at(srv.runtime, 1)
        senders = ["a", "b", "c", "d", "a"]
        answers = [await _send(http, srv.url, s, f"hi {i}", chat="room") for i, s in enumerate(senders)]
        # The agent's limit (3) is stricter than the channel's (5); the session is the room.
        assert [a.get("reason") for a in answers] == [None, None, None, "quota", "quota"]
        assert answers[3]["notice"].startswith("你发送消息太快了")  # the channel's locale


async def test_tokens_per_day_counted_after_each_turn(serve: ServeApp) -> None:
    model = MeteredModel(prompt=30, completion=10)
    channel = webhook_settings(quota_sender_tokens_per_day=50)
    async with (
        serve(channel_settings={"webhook": channel}, provider=model) as srv,
        httpx.AsyncClient(timeout=30) as http,
    ):
        at(srv.runtime, 1)
        assert (await _send(http, srv.url, "tom", "one")).get("reason") is None
        await until(lambda: _is(srv.runtime, 40))
        assert (await _send(http, srv.url, "tom", "two")).get("reason") is None  # 40 < 50
        await until(lambda: _is(srv.runtime, 80))
        third, fourth = await _send(http, srv.url, "tom", "three"), await _send(http, srv.url, "tom", "four")
        assert third["reason"] == fourth["reason"] == "quota"
        assert "usage limit" in third["notice"] and "notice" not in fourth
        assert model.calls == ["one", "two"]
        at(srv.runtime, 86_400 + 1)  # the next UTC day
        assert (await _send(http, srv.url, "tom", "five")).get("reason") is None


async def _is(runtime: Any, tokens: int) -> bool:
    return await _tokens(runtime, "tom") == tokens


async def test_concurrent_increments_are_never_lost(engine: AsyncEngine) -> None:
    counters = [QuotaCounters(engine), QuotaCounters(engine)]
    results = await asyncio.gather(*(counters[i % 2].add("messages", {"s": 1}, 60) for i in range(20)))
    assert sorted(r["s"] for r in results) == list(range(1, 21))
    claims = await asyncio.gather(*(c.claim_notice("messages", "s", 60) for c in counters * 3))
    assert claims.count(True) == 1
    # A later window starts again; a clock behind adds to the current one.
    assert await counters[0].add("messages", {"s": 1}, 120) == {"s": 1}
    assert await counters[1].add("messages", {"s": 1}, 60) == {"s": 2}
    assert await counters[0].read("messages", ["s", "t"], 120) == {"s": 2, "t": 0}
