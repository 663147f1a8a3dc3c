"""SLACK_STREAMING=native: chat.startStream, throttled chat.appendStream, a chat.stopStream ending the answer.

The fake Slack keeps each streamed message's markdown as it grows (start + appends +
stop), so what is asserted is what the conversation shows.
"""

from __future__ import annotations

import asyncio

import httpx

from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls
from tests.fakes.slack import FakeSlack

ANSWER = " ".join(f"word{i}" for i in range(60))


def _ok(fake: FakeSlack, method: str) -> list[sl.Call]:
    return [c for c in fake.calls_of(method) if c.ok]


async def test_streamed_turn_is_start_appends_and_a_stop_completing_the_answer(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeSlack() as fake:
        settings = slack_settings(fake, streaming="native", stream_edit_seconds=0.4)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            dm = sl.dm("tell me a story")
            await post_event(client, srv.url, sl.event_callback(dm))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [start] = _ok(fake, "chat.startStream")
    appends = _ok(fake, "chat.appendStream")
    [stop] = _ok(fake, "chat.stopStream")
    assert row["status"] == "sent"
    assert stored == ANSWER
    ts = row["platform_message_id"]
    assert fake.texts == {ts: stored}, "start + appends + stop show the stored answer, once"
    assert not fake.streaming, "the stream was stopped"
    assert fake.posted() == [] and fake.calls_of("chat.update") == []
    assert start.params["thread_ts"] == dm["ts"]  # a reply to the user's message, as Slack asks
    assert start.params["markdown_text"] and start.params["markdown_text"] != ANSWER
    assert 1 <= len(appends) <= 8  # ~2 s of writing, at most one append per 0.4 s
    assert all(c.params["ts"] == ts for c in [*appends, stop])
    # Each piece is new text: the pieces in order are the answer.
    pieces = [start.params["markdown_text"], *(c.params["markdown_text"] for c in appends)]
    assert "".join([*pieces, stop.params.get("markdown_text") or ""]) == ANSWER


async def test_channel_stream_names_its_recipient_and_streams_in_the_thread(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeSlack() as fake:
        settings = slack_settings(fake, streaming="native", stream_edit_seconds=0.3)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.mention("tell me a story", user="UBOB")
            await post_event(client, srv.url, sl.event_callback(event))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [start] = _ok(fake, "chat.startStream")
    assert start.params["channel"] == "C0GENERAL"
    assert start.params["thread_ts"] == event["ts"]
    assert (start.params["recipient_user_id"], start.params["recipient_team_id"]) == ("UBOB", sl.TEAM_ID)
    assert fake.texts == {row["platform_message_id"]: stored}


async def test_rate_limited_appends_slow_the_stream_and_never_drop_the_answer(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeSlack() as fake:
        fake.fail("chat.appendStream", sl.RATE_LIMITED, sl.RATE_LIMITED)
        fake.fail("chat.stopStream", sl.RATE_LIMITED)  # the final piece too: an outbox retry
        settings = slack_settings(fake, streaming="native", stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"slack": settings},
                stream_first_preview_seconds=0.2,
                outbox_backoff_base_seconds=0.05,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_event(client, srv.url, sl.event_callback(sl.dm("go")))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len(fake.calls_of("chat.appendStream")) >= 2
    assert len(fake.calls_of("chat.stopStream")) == 2  # refused once, then through
    assert fake.texts == {row["platform_message_id"]: stored}
    assert stored == ANSWER and not fake.streaming and fake.posted() == []


async def test_refused_start_stream_posts_the_answer_plainly(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeSlack() as fake:
        fake.always["chat.startStream"] = sl.Failure(200, "not_allowed_token_type")
        settings = slack_settings(fake, streaming="native", stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_event(client, srv.url, sl.event_callback(sl.dm("go")))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len(fake.calls_of("chat.startStream")) == 1, "a refused stream is not tried again in the turn"
    assert fake.calls_of("chat.appendStream") == [] and fake.calls_of("chat.stopStream") == []
    assert [p["text"] for p in fake.posted()] == [stored]
    assert list(fake.texts.values()) == [stored]


async def test_tool_lines_in_the_stream_are_replaced_by_the_answer(serve: ServeApp) -> None:
    # The stream shows "🔧 current_time …", which an append cannot turn into "✓": the answer
    # stops the stream and replaces its text (chat.update), one message either way.
    async with FakeOpenAI(default=Reply(content=ANSWER)) as llm, FakeSlack() as fake:
        llm.enqueue(calls(ToolCall("current_time"), delay=0.6), Reply(content=ANSWER, chunk_delay=0.02))
        settings = slack_settings(fake, streaming="native", stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_event(client, srv.url, sl.event_callback(sl.dm("what time is it?")))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [start] = _ok(fake, "chat.startStream")
    assert start.params["markdown_text"] == "🔧 current_time …"
    assert len(_ok(fake, "chat.stopStream")) == 1
    assert [c.params["text"] for c in _ok(fake, "chat.update")] == [ANSWER]
    assert fake.texts == {row["platform_message_id"]: stored}
    assert stored == ANSWER and fake.posted() == []


async def test_a_long_answer_ends_the_stream_with_its_first_part_and_posts_the_rest(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeSlack() as fake:
        settings = slack_settings(fake, streaming="native", stream_edit_seconds=0.3, max_message_chars=150)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            dm = sl.dm("a long one")
            await post_event(client, srv.url, sl.event_callback(dm))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    assert len(_ok(fake, "chat.startStream")) == 1
    ts = row["platform_message_id"]
    posts = fake.posted()
    assert len(posts) >= 2 and all(p["thread_ts"] == dm["ts"] for p in posts)  # the rest, in its thread
    shown = [fake.texts[ts], *(p["text"] for p in posts)]
    assert all(len(text) <= 150 for text in shown)
    assert "".join(shown).split() == stored.split() == ANSWER.split()  # in order, nothing twice
    assert not fake.streaming


async def test_a_deleted_stream_is_replaced_by_the_answer_as_a_new_message(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeSlack() as fake:
        settings = slack_settings(fake, streaming="native", stream_edit_seconds=0.3)
        async with (
            serve(
                channel_settings={"slack": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            dm = sl.dm("go")
            await post_event(client, srv.url, sl.event_callback(dm))
            [start] = await fake.wait_for("chat.startStream", 1)
            await asyncio.sleep(0.2)
            [ts] = fake.texts
            del fake.texts[ts]  # the user deleted the streaming message
            fake.streaming.discard(ts)
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [post] = fake.posted()
    assert row["status"] == "sent"
    assert post["text"] == stored == ANSWER and post["thread_ts"] == dm["ts"]
    assert fake.texts == {row["platform_message_id"]: stored}
    assert start.params["markdown_text"] != ANSWER
