"""Streamed replies on Discord (fake REST + Gateway, discord.py): one message, edited in place."""

from __future__ import annotations

import httpx

from tests.channels.discord.support import command, discord_settings, post_interaction
from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, Reply

ANSWER = " ".join(f"word{i}" for i in range(60))


def _posts(fake: FakeDiscord, channel_id: str) -> list[dc.Call]:
    return [
        c for c in fake.calls if c.ok and c.method == "POST" and c.path == f"/channels/{channel_id}/messages"
    ]


def _edits(fake: FakeDiscord) -> list[dc.Call]:
    return [c for c in fake.calls if c.method == "PATCH" and c.path.startswith("/channels/")]


async def test_streamed_turn_is_one_message_edited_in_place(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeDiscord() as fake:
        settings = discord_settings(fake, stream_edit_seconds=0.5)
        async with serve(
            channel_settings={"discord": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
        ) as srv:
            await fake.wait_ready()
            await fake.dispatch("MESSAGE_CREATE", dc.message("tell me a story", channel_id="2101"))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    sends = _posts(fake, "2101")
    edits = [c for c in _edits(fake) if c.ok]
    assert row["status"] == "sent"
    assert stored == ANSWER
    assert len(sends) == 1, "the answer is the preview, not a second message"
    assert sends[0].body["content"] != ANSWER  # the preview started with part of the answer
    assert 1 <= len(edits) <= 8  # ~2 s of writing, at most one edit per 0.5 s, final included
    assert edits[-1].body["content"] == ANSWER
    assert fake.texts == {row["platform_message_id"]: stored}
    assert any(c.path == "/channels/2101/typing" for c in fake.calls)


async def test_rate_limited_edits_slow_the_preview_and_the_answer_still_arrives(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeDiscord() as fake:
        fake.edit_script.extend([dc.RATE_LIMITED, dc.RATE_LIMITED, dc.RATE_LIMITED])
        settings = discord_settings(fake, stream_edit_seconds=0.2)
        async with serve(
            channel_settings={"discord": settings},
            stream_first_preview_seconds=0.2,
            outbox_backoff_base_seconds=0.05,
            **llm_settings(llm),
        ) as srv:
            await fake.wait_ready()
            await fake.dispatch("MESSAGE_CREATE", dc.message("go", channel_id="2102"))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len(_posts(fake, "2102")) == 1
    assert list(fake.texts.values()) == [stored]
    assert len(_edits(fake)) >= 4  # three refused with 429, then through


async def test_streaming_off_sends_one_plain_message(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.01)) as llm, FakeDiscord() as fake:
        settings = discord_settings(fake, streaming="off")
        async with serve(
            channel_settings={"discord": settings}, stream_first_preview_seconds=0.1, **llm_settings(llm)
        ) as srv:
            await fake.wait_ready()
            await fake.dispatch("MESSAGE_CREATE", dc.message("hi", channel_id="2103"))
            await wait_outbox_final(srv.runtime)
    assert [c.body["content"] for c in _posts(fake, "2103")] == [ANSWER]
    assert not _edits(fake)
    assert not any(c.path.endswith("/typing") for c in fake.calls)


async def test_a_slash_command_streams_into_its_deferred_answer(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeDiscord() as fake:
        settings = discord_settings(fake, gateway=False, stream_edit_seconds=0.5)
        async with (
            serve(
                channel_settings={"discord": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_interaction(client, srv.url, command("story", interaction_id="5101"))
            assert resp.json() == {"type": 5}
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    hook = f"/webhooks/{dc.APP_ID}/itoken-5101"
    patches = [c for c in fake.calls if c.ok and c.method == "PATCH"]
    assert row["status"] == "sent" and stored == ANSWER
    assert patches[0].path == f"{hook}/messages/@original"  # the preview is the deferred answer
    assert all(c.path.startswith(f"{hook}/messages/") for c in patches)
    assert patches[-1].body["content"] == ANSWER
    assert not [c for c in fake.calls if c.method == "POST" and "content" in c.body]  # no second message
    assert fake.texts == {row["platform_message_id"]: stored}
    assert not any(c.path.endswith("/typing") for c in fake.calls)
