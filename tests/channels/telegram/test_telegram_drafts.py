"""TELEGRAM_STREAMING=native: previews as message drafts (sendMessageDraft), the answer one sendMessage.

The fake Bot API keeps each draft's current text apart from the chat's messages, so what
is asserted is what the user sees: drafts while the model writes, then one message.
"""

from __future__ import annotations

import httpx

from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram import FakeTelegram

ANSWER = " ".join(f"word{i}" for i in range(60))


def _ok(fake: FakeTelegram, method: str) -> list[tg.Call]:
    return [c for c in fake.calls_of(method) if c.ok]


async def test_drafts_while_writing_then_the_answer_as_one_message(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeTelegram() as fake:
        settings = tg_settings(fake, streaming="native", stream_edit_seconds=0.4)
        async with (
            serve(
                channel_settings={"telegram": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(600, tg.message("tell me a story")))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    drafts = _ok(fake, "sendMessageDraft")
    [sent] = _ok(fake, "sendMessage")
    assert row["status"] == "sent" and stored == ANSWER
    assert sent.params["text"] == stored
    assert fake.texts == {int(row["platform_message_id"]): stored}, "one message: the answer"
    assert not fake.calls_of("editMessageText")
    assert 2 <= len(drafts) <= 8  # ~2 s of writing, at most one draft per 0.4 s
    assert {c.params["draft_id"] for c in drafts} == {drafts[0].params["draft_id"]} != {"0"}
    texts = [c.params["text"] for c in drafts]
    assert all(ANSWER.startswith(t) for t in texts) and texts[0] != ANSWER, texts
    assert texts == sorted(texts, key=len)
    assert fake.calls.index(drafts[-1]) < fake.calls.index(sent), "no draft after the answer"
    assert fake.calls_of("sendChatAction")


async def test_flood_control_on_drafts_never_drops_the_answer(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeTelegram() as fake:
        fake.fail("sendMessageDraft", None, tg.TOO_MANY_REQUESTS, tg.TOO_MANY_REQUESTS)
        fake.fail("sendMessage", tg.TOO_MANY_REQUESTS)  # the answer too: an outbox retry
        settings = tg_settings(fake, streaming="native", stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"telegram": settings},
                stream_first_preview_seconds=0.2,
                outbox_backoff_base_seconds=0.05,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(601, tg.message("go")))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len(fake.calls_of("sendMessageDraft")) >= 4  # two refused, the preview went on
    assert len(fake.calls_of("sendMessage")) == 2  # refused once, then through
    assert [c.params["text"] for c in _ok(fake, "sendMessage")] == [stored]
    assert list(fake.texts.values()) == [stored]


async def test_refused_draft_sends_the_answer_plainly(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeTelegram() as fake:
        fake.always["sendMessageDraft"] = tg.Failure(400, "Bad Request: method is not available")
        settings = tg_settings(fake, streaming="native", stream_edit_seconds=0.2)
        async with (
            serve(
                channel_settings={"telegram": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(602, tg.message("go")))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    assert row["status"] == "sent"
    assert len(fake.calls_of("sendMessageDraft")) == 1, "a refused draft is not tried again in the turn"
    assert fake.sent_texts() == [stored]
    assert not fake.calls_of("editMessageText")


async def test_groups_have_no_drafts_and_preview_by_editing(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeTelegram() as fake:
        settings = tg_settings(
            fake, streaming="native", stream_edit_seconds=0.4, require_mention_in_groups=False
        )
        async with (
            serve(
                channel_settings={"telegram": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            msg = tg.message("tell me a story", chat=tg.group_chat())
            await post_update(client, srv.url, tg.update(603, msg))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    assert not fake.calls_of("sendMessageDraft")
    assert len(_ok(fake, "sendMessage")) == 1
    assert _ok(fake, "editMessageText")[-1].params["text"] == stored
    assert fake.texts == {int(row["platform_message_id"]): stored}


async def test_a_draft_unchanged_for_a_while_is_sent_again_before_it_fades(serve: ServeApp) -> None:
    # The model is silent for 6 s: the draft shows "still working" and is renewed on the
    # typing tick (every 4 s) once it is older than TELEGRAM_DRAFT_REFRESH_SECONDS.
    async with FakeOpenAI(default=Reply(content="Done.", delay=6.0)) as llm, FakeTelegram() as fake:
        settings = tg_settings(fake, streaming="native", stream_edit_seconds=0.2, draft_refresh_seconds=1.0)
        async with (
            serve(
                channel_settings={"telegram": settings},
                stream_first_preview_seconds=0.2,
                stream_still_working_seconds=0.3,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(604, tg.message("think hard")))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
    drafts = _ok(fake, "sendMessageDraft")
    [sent] = _ok(fake, "sendMessage")
    assert row["status"] == "sent" and sent.params["text"] == "Done."
    texts = [c.params["text"] for c in drafts]
    assert texts.count("⏳ Still working…") >= 2, f"the draft was not renewed: {texts}"
    assert set(texts) <= {"⏳ Still working…", "Done."}
    assert len({c.params["draft_id"] for c in drafts}) == 1
    assert fake.calls.index(drafts[-1]) < fake.calls.index(sent)
