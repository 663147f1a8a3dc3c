"""Streamed replies on Telegram: a preview sent, edited in place (throttled), completed by the answer.

The model is a fake OpenAI-compatible server writing slowly; Telegram is the fake Bot API
with the real PTB client. What is asserted is what the chat shows.
"""

from __future__ import annotations

import httpx

from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls
from tests.fakes.telegram import FakeTelegram

ANSWER = " ".join(f"word{i}" for i in range(60))  # ~400 characters, 100 pieces of 4


async def test_streamed_turn_is_one_message_edited_in_place(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeTelegram() as fake:
        settings = tg_settings(fake, stream_edit_seconds=0.5)
        async with (
            serve(
                channel_settings={"telegram": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(500, tg.message("tell me a story")))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    sends = [c for c in fake.calls_of("sendMessage") if c.ok]
    edits = [c for c in fake.calls_of("editMessageText") if c.ok]
    assert row["status"] == "sent"
    assert len(sends) == 1, "the answer is the preview, not a second message"
    preview_id = next(iter(fake.texts))
    assert fake.texts == {preview_id: stored}
    assert stored == ANSWER
    assert sends[0].params["text"] != ANSWER  # the preview started with part of the answer
    assert 1 <= len(edits) <= 8  # ~3 s of writing at most one edit per 0.5 s, final included
    assert edits[-1].params["text"] == ANSWER
    assert row["platform_message_id"] == str(preview_id)
    typing = fake.calls_of("sendChatAction")
    assert typing and all(c.params["action"] == "typing" for c in typing)


async def test_flood_control_on_an_edit_slows_the_preview_never_drops_the_answer(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeTelegram() as fake:
        # Every edit but the last answers 429 for a while: previews stall, the answer waits and arrives.
        fake.fail("editMessageText", tg.TOO_MANY_REQUESTS, tg.TOO_MANY_REQUESTS, tg.TOO_MANY_REQUESTS)
        settings = tg_settings(fake, stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"telegram": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(501, tg.message("go")))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len([c for c in fake.calls_of("sendMessage") if c.ok]) == 1
    assert list(fake.texts.values()) == [stored]
    assert len(fake.calls_of("editMessageText")) >= 4  # three refused, then through


async def test_quick_answer_is_a_plain_message_and_streaming_off_sends_no_preview(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake, streaming="off")}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(502, tg.message("hi")))
            await wait_outbox_final(srv.runtime)
    assert fake.sent_texts() == ["You said: hi"]
    assert not fake.calls_of("editMessageText")
    assert not fake.calls_of("sendChatAction")


async def test_tool_progress_and_still_working_show_in_the_preview(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content="It is noon.")) as llm, FakeTelegram() as fake:
        # The model thinks for a while, calls a tool, thinks again, then answers.
        llm.enqueue(calls(ToolCall("current_time"), delay=1.2), Reply(content="It is noon.", delay=1.2))
        settings = tg_settings(fake, stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"telegram": settings},
                stream_first_preview_seconds=0.2,
                stream_still_working_seconds=0.5,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(503, tg.message("what time is it?")))
            [row] = await wait_outbox_final(srv.runtime)
    shown = [c.params["text"] for c in fake.calls if c.method in ("sendMessage", "editMessageText") and c.ok]
    assert row["status"] == "sent"
    assert shown[0] == "⏳ Still working…"
    assert any("🔧 current_time" in text for text in shown[1:-1])
    assert shown[-1] == "It is noon."
    assert len([c for c in fake.calls_of("sendMessage") if c.ok]) == 1
    assert list(fake.texts.values()) == ["It is noon."]


async def test_a_turn_started_by_several_messages_is_one_preview_completed_once(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeTelegram() as fake:
        settings = tg_settings(fake, stream_edit_seconds=0.3, busy_policy="collect")
        async with (
            serve(
                channel_settings={"telegram": settings},
                stream_first_preview_seconds=0.2,
                collect_debounce_seconds=0.5,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(510, tg.message("first part")))
            await post_update(client, srv.url, tg.update(511, tg.message("second part")))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    assert len(llm.requests) == 1  # one turn for both messages
    assert row["status"] == "sent"
    assert len([c for c in fake.calls_of("sendMessage") if c.ok]) == 1
    assert list(fake.texts.values()) == [stored]
