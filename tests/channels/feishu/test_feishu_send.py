"""Feishu replies: the tenant access token, retries and failures, long replies."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.errors import ChannelSendAuthError
from app.events import OutboundMessage, TextPart
from channels.feishu import FeishuChannel
from tests.channels.feishu.support import feishu_settings, post_callback
from tests.channels.support import send_only_context, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu


async def test_outage_on_send_is_retried_then_recorded_as_failed(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        fake.always["create"] = fs.SERVER_ERROR
        async with (
            serve(
                channel_settings={"feishu": feishu_settings(fake)},
                outbox_max_attempts=3,
                outbox_backoff_base_seconds=0.05,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.text_event("anyone?"))
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "failed"
    assert row["attempts"] == 3
    assert "1500" in row["last_error"]
    assert len(fake.calls_of("create")) == 3
    assert len(fake.calls_of("token")) == 1  # one token served every attempt


async def test_rate_limit_is_retried_and_refusals_are_not(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            # One at a time: the fake answers each scripted failure to the next send.
            fake.fail("create", fs.RATE_LIMITED)
            await post_callback(client, srv.url, fs.text_event("one", chat_id="oc_1"))
            await wait_outbox_final(srv.runtime)
            fake.fail("create", fs.BOT_NOT_IN_CHAT)
            await post_callback(client, srv.url, fs.text_event("two", chat_id="oc_2"))
            await wait_outbox_final(srv.runtime, 2)
            fake.fail("create", fs.NO_PERMISSION)
            await post_callback(client, srv.url, fs.text_event("three", chat_id="oc_3"))
            rows = await wait_outbox_final(srv.runtime, 3)
    by_chat = {r["chat_id"]: r for r in rows}
    # 429 with x-ogw-ratelimit-reset: 1, then accepted.
    assert (by_chat["oc_1"]["status"], by_chat["oc_1"]["attempts"]) == ("sent", 2)
    assert "429" in by_chat["oc_1"]["last_error"]
    assert (by_chat["oc_2"]["status"], by_chat["oc_2"]["attempts"]) == ("failed", 1)
    assert "230002" in by_chat["oc_2"]["last_error"]
    assert (by_chat["oc_3"]["status"], by_chat["oc_3"]["attempts"]) == ("failed", 1)
    assert "99991672" in by_chat["oc_3"]["last_error"]


async def test_token_is_refreshed_before_it_expires() -> None:
    async with FakeFeishu(token_lifetime=2) as fake, httpx.AsyncClient(timeout=10) as http:
        # A 2 s token is used for its first second only (the margin is capped at half its life).
        channel = FeishuChannel(feishu_settings(fake), send_only_context(http))
        await channel.start()
        first = OutboundMessage(channel="feishu", chat_id="oc_a", parts=(TextPart(text="one"),))
        await channel.send(first)
        await channel.send(first.model_copy(update={"message_id": "m2"}))
        await asyncio.sleep(1.2)
        await channel.send(first.model_copy(update={"message_id": "m3"}))
    sends = fake.calls_of("create")
    assert all(c.ok for c in fake.calls), "no call ever carried an expired token"
    assert [c.token for c in sends] == ["t-0001", "t-0001", "t-0002"]
    assert len(fake.calls_of("token")) == 2


async def test_a_token_feishu_refuses_is_replaced_once() -> None:
    async with FakeFeishu() as fake, httpx.AsyncClient(timeout=10) as http:
        channel = FeishuChannel(feishu_settings(fake, bot_open_id=fs.BOT_OPEN_ID), send_only_context(http))
        message = OutboundMessage(channel="feishu", chat_id="oc_a", parts=(TextPart(text="hi"),))
        await channel.send(message)
        fake.revoke_tokens()  # e.g. the app secret was reset
        result = await channel.send(message.model_copy(update={"message_id": "m2"}))
    assert result.platform_message_id == "om_sent0002"
    assert [(c.kind, c.ok) for c in fake.calls] == [
        ("token", True),
        ("create", True),
        ("create", False),  # 99991663: invalid token
        ("token", True),
        ("create", True),
    ]


async def test_long_reply_is_split_and_a_retry_does_not_repeat_parts(serve: ServeApp) -> None:
    words = " ".join(f"词{i}" for i in range(600))  # ~3,000 characters, ~5,000 bytes
    async with FakeFeishu() as fake:
        fake.fail("reply", None, fs.SERVER_ERROR)  # part 1 sent, part 2 fails once
        settings = feishu_settings(fake, max_message_bytes=2000)
        async with (
            serve(channel_settings={"feishu": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.group_mention(words, message_id="om_long"))
            [row] = await wait_outbox_final(srv.runtime)
    sent = fake.delivered()
    assert row["status"] == "sent"
    assert row["attempts"] == 2
    assert len(fake.calls_of("reply")) == len(sent) + 1
    assert len(sent) >= 3
    assert all(c.path == "/open-apis/im/v1/messages/om_long/reply" for c in sent)
    # The limit is on the text as sent (JSON-escaped twice); the envelope adds a little.
    assert all(c.size <= 2000 + 200 for c in sent), [c.size for c in sent]
    assert max(c.size for c in sent) > 1500
    assert "".join(c.text for c in sent) == f"You said: {words}"
    uuids = [c.body["uuid"] for c in sent]
    assert len(set(uuids)) == len(uuids)
    assert all(u.startswith(row["message_id"]) for u in uuids)


async def test_no_credentials_means_a_clear_failure_not_a_retry_loop() -> None:
    async with FakeFeishu() as fake, httpx.AsyncClient(timeout=10) as http:
        channel = FeishuChannel(feishu_settings(fake, app_secret="wrong"), send_only_context(http))
        message = OutboundMessage(channel="feishu", chat_id="oc_a", parts=(TextPart(text="hi"),))
        with pytest.raises(ChannelSendAuthError, match="10014"):
            await channel.send(message)
    assert not fake.calls_of("create")
