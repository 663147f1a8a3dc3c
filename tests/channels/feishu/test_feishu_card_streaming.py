"""FEISHU_STREAMING=native: the answer streams into a card (CardKit), completed once by the outbox."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.channels.discord.test_discord_streaming import ANSWER
from tests.channels.feishu.support import LARK_OAPI, feishu_settings, post_callback
from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import Call, FakeFeishu
from tests.fakes.openai_server import FakeOpenAI, Reply


@LARK_OAPI
async def test_streamed_turn_is_one_card_updated_in_place_then_closed(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeFeishu() as fake:
        settings = feishu_settings(fake, streaming="native", stream_edit_seconds=0.3)
        async with (
            serve(
                channel_settings={"feishu": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_callback(client, srv.url, fs.text_event("tell me a story", chat_id="oc_c1"))
            assert resp.status_code == 200
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [create] = fake.calls_of("card_create")
    [(card_id, card)] = fake.cards.items()
    [sent] = fake.delivered()
    updates = fake.calls_of("card_content")
    [close] = fake.calls_of("card_settings")
    assert row["status"] == "sent" and stored == ANSWER
    created = json.loads(create.body["data"])
    assert create.body["type"] == "card_json" and created["config"]["streaming_mode"] is True
    assert sent.body["msg_type"] == "interactive"
    assert json.loads(sent.body["content"]) == {"type": "card", "data": {"card_id": card_id}}
    assert card.messages == [row["platform_message_id"]]
    assert all(u.ok for u in updates) and 2 <= len(updates) <= 20
    assert updates[-1].body["content"] == stored and updates[0].body["content"] != stored
    sequences = [c.body["sequence"] for c in [*updates, close]]
    assert sequences == sorted(set(sequences)), "sequence numbers must grow"
    assert close.ok and json.loads(close.body["settings"]) == {"config": {"streaming_mode": False}}
    assert card.text == stored and card.streaming is False
    assert fake.texts == {}, "no text message besides the card"
    for call in [create, *updates, close]:
        assert _as_the_sdk_builds_it(call) == (call.path, call.body)


def _as_the_sdk_builds_it(call: Call) -> tuple[str, dict[str, Any]]:
    """The path and body lark-oapi (the official SDK) makes of the values we sent."""
    import lark_oapi
    from lark_oapi.api.cardkit.v1 import Card as SdkCard
    from lark_oapi.api.cardkit.v1 import (
        ContentCardElementRequest,
        ContentCardElementRequestBody,
        CreateCardRequest,
        CreateCardRequestBody,
        SettingsCardRequest,
        SettingsCardRequestBody,
        UpdateCardRequest,
        UpdateCardRequestBody,
    )

    b = call.body
    request: Any
    if call.kind == "card_create":
        body: Any = CreateCardRequestBody.builder().type(b["type"]).data(b["data"]).build()
        request = CreateCardRequest.builder().request_body(body).build()
    elif call.kind == "card_content":
        _, card_id, _, element_id, _ = call.path.rsplit("/", 4)
        body = ContentCardElementRequestBody.builder().uuid(b["uuid"]).content(b["content"])
        body = body.sequence(b["sequence"]).build()
        request = ContentCardElementRequest.builder().card_id(card_id).element_id(element_id)
        request = request.request_body(body).build()
    elif call.kind == "card_update":
        card = SdkCard.builder().type(b["card"]["type"]).data(b["card"]["data"]).build()
        body = UpdateCardRequestBody.builder().card(card).uuid(b["uuid"]).sequence(b["sequence"]).build()
        request = UpdateCardRequest.builder().card_id(call.path.rsplit("/", 1)[1]).request_body(body).build()
    else:
        card_id = call.path.rsplit("/", 2)[1]
        body = SettingsCardRequestBody.builder().settings(b["settings"]).uuid(b["uuid"])
        body = body.sequence(b["sequence"]).build()
        request = SettingsCardRequest.builder().card_id(card_id).request_body(body).build()
    path = request.uri
    for name, value in request.paths.items():
        path = path.replace(f":{name}", value)
    return path, json.loads(lark_oapi.JSON.marshal(request.body))


async def test_refused_card_creation_falls_back_to_a_text_preview_edited_in_place(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeFeishu() as fake:
        fake.always["card_create"] = fs.NO_PERMISSION  # the app lacks cardkit:card:write
        settings = feishu_settings(fake, streaming="native", stream_edit_seconds=0.3)
        async with (
            serve(
                channel_settings={"feishu": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.text_event("tell me a story", chat_id="oc_c2"))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [sent] = fake.delivered()
    edits = [c for c in fake.calls_of("update") if c.ok]
    assert row["status"] == "sent"
    assert fake.calls_of("card_create") and not fake.cards
    assert sent.body["msg_type"] == "text" and sent.text != stored
    assert edits and edits[-1].text == stored
    assert fake.texts == {row["platform_message_id"]: stored}


@LARK_OAPI
async def test_card_past_its_streaming_time_is_replaced_whole_by_the_answer(serve: ServeApp) -> None:
    async with (
        FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.06)) as llm,
        FakeFeishu(card_streaming_seconds=1.2) as fake,
    ):
        settings = feishu_settings(
            fake, streaming="native", stream_edit_seconds=0.2, card_streaming_seconds=1
        )
        async with (
            serve(
                channel_settings={"feishu": settings}, stream_first_preview_seconds=0.2, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.text_event("a slow one", chat_id="oc_c3"))
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [card] = fake.cards.values()
    [sent] = fake.delivered()
    [update] = fake.calls_of("card_update")
    assert row["status"] == "sent" and sent.body["msg_type"] == "interactive"
    assert all(c.ok for c in fake.calls_of("card_content")), "no update after the streaming time"
    assert update.ok and json.loads(update.body["card"]["data"])["config"]["streaming_mode"] is False
    assert card.text == stored and not card.streaming
    assert _as_the_sdk_builds_it(update) == (update.path, update.body)
    assert fake.texts == {}


async def test_a_deleted_card_is_recalled_and_the_answer_sent_as_a_message(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeFeishu() as fake:
        settings = feishu_settings(fake, streaming="native", stream_edit_seconds=0.3)
        async with (
            serve(
                channel_settings={"feishu": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.text_event("go", chat_id="oc_c4"))
            await fake.wait_for(1, "card_content")
            [card] = fake.cards.values()
            [card_message_id] = card.messages
            fake.cards.clear()  # the card entity is gone
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    card_message, answer = fake.delivered()
    [recall] = fake.calls_of("recall")
    assert row["status"] == "sent"
    assert card_message.body["msg_type"] == "interactive"
    assert recall.ok and fake.recalled == {card_message_id}
    assert answer.text == stored and answer.body["uuid"].startswith(row["message_id"])
    assert fake.texts == {row["platform_message_id"]: stored}
