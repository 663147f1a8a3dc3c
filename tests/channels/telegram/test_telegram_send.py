"""Telegram replies: sendMessage through the real PTB Bot, split and typed errors for the outbox."""

from __future__ import annotations

import httpx

from tests.channels.support import wait_outbox_final
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram


async def test_outage_on_send_is_retried_then_recorded_as_failed(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        fake.always["sendMessage"] = tg.SERVER_ERROR
        async with (
            serve(
                channel_settings={"telegram": tg_settings(fake)},
                outbox_max_attempts=3,
                outbox_backoff_base_seconds=0.05,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(30, tg.message("anyone there?")))
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "failed"
    assert row["attempts"] == 3
    assert "Telegram unreachable" in row["last_error"]
    assert len(fake.calls_of("sendMessage")) == 3


async def test_flood_control_retry_after_is_honoured(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        fake.fail("sendMessage", tg.TOO_MANY_REQUESTS)  # retry_after=1
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(31, tg.message("flood")))
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "sent"
    assert row["attempts"] == 2
    assert len(fake.calls_of("sendMessage")) == 2


async def test_blocked_bot_and_revoked_token_are_not_retried(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        fake.fail("sendMessage", tg.BLOCKED, tg.UNAUTHORIZED)
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(32, tg.message("hi")))
            await wait_outbox_final(srv.runtime, 1)
            other = tg.message("hi", chat=tg.private_chat(5151), sender=tg.user(5151))
            await post_update(client, srv.url, tg.update(33, other))
            blocked, unauthorized = await wait_outbox_final(srv.runtime, 2)
    assert (blocked["status"], blocked["attempts"]) == ("failed", 1)
    assert "blocked" in blocked["last_error"]
    assert (unauthorized["status"], unauthorized["attempts"]) == ("failed", 1)
    assert "refused the bot token" in unauthorized["last_error"]
    assert len(fake.calls_of("sendMessage")) == 2


async def test_long_reply_is_split_and_a_retry_does_not_repeat_delivered_parts(serve: ServeApp) -> None:
    words = " ".join(f"word{i}" for i in range(1200))  # ~8,900 characters
    async with FakeTelegram() as fake:
        fake.fail("sendMessage", None, tg.SERVER_ERROR)  # the first part goes out, the second fails once
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(70, tg.message(words)))
            [row] = await wait_outbox_final(srv.runtime)
    texts = fake.sent_texts()
    assert row["status"] == "sent"
    assert row["attempts"] == 2
    assert len(fake.calls_of("sendMessage")) == 4  # part 1, part 2 (500), then parts 2 and 3
    assert len(texts) == 3
    assert all(len(t) <= 4096 for t in texts)
    assert "".join(texts) == f"You said: {words}"
    assert all(not t.startswith("d") for t in texts[1:])  # cut between words
