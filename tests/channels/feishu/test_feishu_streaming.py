"""Streamed replies on Feishu: a text message sent, edited in place (PUT), completed by the answer."""

from __future__ import annotations

import httpx

from tests.channels.discord.test_discord_streaming import ANSWER
from tests.channels.feishu.support import feishu_settings, post_callback
from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai_server import FakeOpenAI, Reply


async def test_streamed_turn_is_one_message_edited_in_place(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeFeishu() as fake:
        settings = feishu_settings(fake, stream_edit_seconds=0.5)
        async with (
            serve(
                channel_settings={"feishu": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_callback(client, srv.url, fs.text_event("tell me a story", chat_id="oc_s1"))
            assert resp.status_code == 200
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    sends = fake.delivered()
    edits = [c for c in fake.calls_of("update") if c.ok]
    assert row["status"] == "sent"
    assert stored == ANSWER
    assert len(sends) == 1, "the answer is the preview, not a second message"
    assert sends[0].text != ANSWER
    assert 1 <= len(edits) <= 8
    assert edits[-1].text == ANSWER
    assert fake.texts == {row["platform_message_id"]: stored}


async def test_rate_limited_edits_slow_the_preview_and_the_answer_still_arrives(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeFeishu() as fake:
        limited = fs.Failure(
            429, 99991400, "request trigger frequency limit", {"x-ogw-ratelimit-reset": "0.2"}
        )
        fake.fail("update", limited, limited, limited)
        settings = feishu_settings(fake, stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"feishu": settings},
                stream_first_preview_seconds=0.2,
                outbox_backoff_base_seconds=0.05,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.text_event("go", chat_id="oc_s2"))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len(fake.delivered()) == 1
    assert list(fake.texts.values()) == [stored]
    assert len(fake.calls_of("update")) >= 4  # three refused with 429, then through


async def test_a_long_stream_stays_within_feishus_20_edits_and_the_last_is_the_answer(
    serve: ServeApp,
) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeFeishu() as fake:
        settings = feishu_settings(fake, stream_edit_seconds=0.05)
        async with (
            serve(
                channel_settings={"feishu": settings}, stream_first_preview_seconds=0.1, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.text_event("a long one", chat_id="oc_s3"))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    edits = fake.calls_of("update")
    assert row["status"] == "sent"
    assert len(fake.delivered()) == 1
    assert all(c.ok for c in edits) and len(edits) == 20  # the budget spent, the last edit kept
    assert edits[-1].text == stored
    assert fake.texts == {row["platform_message_id"]: stored}


async def test_a_preview_that_cannot_be_edited_is_recalled_and_replaced_by_the_answer(
    serve: ServeApp,
) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeFeishu() as fake:
        # Its edits spent (as after a restart mid-stream): every edit is refused.
        fake.always["update"] = fs.Failure(
            400, 230072, "The message has reached the number of times it can be edited."
        )
        settings = feishu_settings(fake, stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"feishu": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.text_event("go on", chat_id="oc_s4"))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    preview, answer = fake.delivered()
    [recall] = fake.calls_of("recall")
    assert row["status"] == "sent"
    recalled = recall.path.rsplit("/", 1)[1]
    assert recall.ok and recalled != row["platform_message_id"]
    assert "uuid" not in preview.body and answer.body["uuid"].startswith(row["message_id"])
    assert fake.texts == {row["platform_message_id"]: stored}  # the half preview is gone
    assert answer.text == stored
