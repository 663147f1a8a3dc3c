"""Streamed replies on Slack: chat.postMessage, then throttled chat.update, the answer as the last update."""

from __future__ import annotations

import httpx

from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack import FakeSlack

ANSWER = " ".join(f"word{i}" for i in range(60))


async def test_streamed_turn_is_one_message_updated_in_place(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeSlack() as fake:
        settings = slack_settings(fake, stream_edit_seconds=0.5)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_event(client, srv.url, sl.event_callback(sl.dm("tell me a story")))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    posts = fake.posted()
    updates = [c for c in fake.calls_of("chat.update") if c.ok]
    assert row["status"] == "sent"
    assert len(posts) == 1
    assert posts[0]["text"] != ANSWER
    ts = row["platform_message_id"]
    assert fake.texts == {ts: stored}
    assert stored == ANSWER
    assert 1 <= len(updates) <= 8
    assert updates[-1].params["text"] == ANSWER


async def test_rate_limit_on_an_update_never_drops_the_answer(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeSlack() as fake:
        fake.fail("chat.update", sl.RATE_LIMITED, sl.RATE_LIMITED, sl.RATE_LIMITED)
        settings = slack_settings(fake, stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_event(client, srv.url, sl.event_callback(sl.dm("go")))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len(fake.posted()) == 1
    assert list(fake.texts.values()) == [stored]
    assert len(fake.calls_of("chat.update")) >= 4
