"""Slack replies: chat.postMessage through the real AsyncWebClient, errors typed for the outbox."""

from __future__ import annotations

import httpx

from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import inbox_keys, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.slack import FakeSlack


async def test_outage_on_send_is_retried_then_recorded_as_failed(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        fake.always["chat.postMessage"] = sl.SERVER_ERROR
        async with (
            serve(
                channel_settings={"slack": slack_settings(fake)},
                outbox_max_attempts=3,
                outbox_backoff_base_seconds=0.05,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_event(client, srv.url, sl.event_callback(sl.dm("anyone?")))
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "failed"
    assert row["attempts"] == 3
    assert "500" in row["last_error"]
    assert len(fake.calls_of("chat.postMessage")) == 3


async def test_rate_limit_is_retried_after_retry_after_and_refusals_are_not_retried(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        fake.by_channel["D01"] = [sl.RATE_LIMITED]  # Retry-After: 1, then accepted
        fake.by_channel["D02"] = [sl.INVALID_AUTH]
        fake.by_channel["D03"] = [sl.CHANNEL_NOT_FOUND]
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            for channel in ("D01", "D02", "D03"):
                await post_event(client, srv.url, sl.event_callback(sl.dm(channel, channel=channel)))
            rows = await wait_outbox_final(srv.runtime, 3)
    by_chat = {r["chat_id"]: r for r in rows}
    assert by_chat["D01"]["status"] == "sent"
    assert by_chat["D01"]["attempts"] == 2
    assert "rate limit" in by_chat["D01"]["last_error"]
    assert (by_chat["D02"]["status"], by_chat["D02"]["attempts"]) == ("failed", 1)
    assert "invalid_auth" in by_chat["D02"]["last_error"]
    assert (by_chat["D03"]["status"], by_chat["D03"]["attempts"]) == ("failed", 1)
    assert "channel_not_found" in by_chat["D03"]["last_error"]
    assert [c.params["channel"] for c in fake.calls_of("chat.postMessage")].count("D01") == 2


async def test_long_reply_is_split_in_the_thread_and_a_retry_does_not_repeat_parts(serve: ServeApp) -> None:
    words = " ".join(f"w{i}" for i in range(100))  # ~390 characters
    async with FakeSlack() as fake:
        fake.fail("chat.postMessage", None, sl.SERVER_ERROR)  # part 1 posted, part 2 fails once
        async with (
            serve(channel_settings={"slack": slack_settings(fake, max_message_chars=150)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.mention(words)
            await post_event(client, srv.url, sl.event_callback(event))
            [row] = await wait_outbox_final(srv.runtime)
            assert await inbox_keys(srv.runtime) == [f"slack:C0GENERAL:{event['ts']}"]
    posted = fake.posted()
    assert row["status"] == "sent"
    assert row["attempts"] == 2
    assert len(fake.calls_of("chat.postMessage")) == 4
    assert len(posted) == 3
    assert all(len(p["text"]) <= 150 for p in posted)
    assert "".join(p["text"] for p in posted) == f"You said: {words}"
    assert all(p["thread_ts"] == event["ts"] for p in posted)
