"""OneBot media against a fake bridge: image and record segments downloaded from their URLs
before the event is stored, a too-large file answered politely, replies' images sent as
`base64://` image segments (retried when the bridge fails), the optional working notice."""

from __future__ import annotations

import base64

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages, outbox
from app.events import ImagePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from tests.channels.onebot.test_onebot import BOT, SECRET, TOKEN, _post, onebot_settings, ws_url
from tests.channels.support import LOCAL_MEDIA, count, wait_outbox_final
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes.media_server import FakeMediaServer
from tests.fakes.onebot import FakeBridge, FakeHttpApi, private_message
from tests.fakes.openai_server import FakeOpenAI, Reply


def _image(media: FakeMediaServer, name: str) -> dict[str, object]:
    return {"type": "image", "data": {"file": name, "url": media.url_of(name)}}


async def test_inbound_image_reaches_the_model_as_its_bytes(serve: ServeApp) -> None:
    async with FakeMediaServer() as media, FakeOpenAI(default=Reply(content="A tiny pixel.")) as llm:
        media.files["pixel.png"] = (PIXEL, "image/png")
        async with (
            serve(
                **LOCAL_MEDIA,
                channel_settings={"onebot": onebot_settings()},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                llm_vision=True,
            ) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            message = [{"type": "text", "data": {"text": "what is this?"}}, _image(media, "pixel.png")]
            await bridge.send_event(private_message(BOT, 555, message))
            [action] = await bridge.wait_for_actions(1)
    assert media.downloads == ["pixel.png"]
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(PIXEL).decode()]
    assert action.params["message"] == [{"type": "text", "data": {"text": "A tiny pixel."}}]


async def test_too_large_image_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeMediaServer() as media:
        media.files["big.jpg"] = (b"x" * 5000, "image/jpeg")
        async with (
            serve(**LOCAL_MEDIA, channel_settings={"onebot": onebot_settings(media_max_bytes=1000)}) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            await bridge.send_event(private_message(BOT, 556, [_image(media, "big.jpg")]))
            [action] = await bridge.wait_for_actions(1)
            assert await count(srv.runtime, inbox) == 0
    assert action.action == "send_private_msg"
    assert action.params["user_id"] == 556
    assert "too large" in action.params["message"][0]["data"]["text"]


async def test_voice_record_is_transcribed_when_speech_to_text_is_on(serve: ServeApp) -> None:
    audio = b"#!SILK_V3 fake voice"
    async with FakeMediaServer() as media, FakeOpenAI(default=Reply(content="Noted.")) as llm:
        media.files["voice.silk"] = (audio, "application/octet-stream")
        llm.transcript = "call mum at six"
        async with (
            serve(
                **LOCAL_MEDIA,
                channel_settings={"onebot": onebot_settings()},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                stt_model="whisper-1",
            ) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            record = {"type": "record", "data": {"file": "voice.silk", "url": media.url_of("voice.silk")}}
            await bridge.send_event(private_message(BOT, 557, [record]))
            await bridge.wait_for_actions(1)
            async with srv.runtime.engine.connect() as conn:
                [(content, parts)] = (
                    await conn.execute(
                        select(messages.c.content, messages.c.parts).where(messages.c.role == "user")
                    )
                ).all()
    assert llm.transcriptions == [{"model": "whisper-1", "audio": audio}]
    assert content == "call mum at six"
    assert parts[0]["mime_type"] == "audio/silk"
    assert base64.b64decode(parts[0]["data_base64"]) == audio


async def test_outbound_image_is_a_base64_segment_and_a_failed_send_is_retried(serve: ServeApp) -> None:
    async with serve(channel_settings={"onebot": onebot_settings()}, outbox_backoff_base_seconds=0.05) as srv:
        async with FakeBridge(ws_url(srv), BOT, TOKEN, fail_at=frozenset({1})) as bridge:
            message = OutboundMessage(
                channel="onebot",
                chat_id="private:558",
                session_key="onebot:private%3A558",
                parts=(
                    TextPart(text="The chart:"),
                    ImagePart(data_base64=base64.b64encode(PIXEL).decode(), mime_type="image/png"),
                ),
                metadata={"reply_self_id": str(BOT)},
            )
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(
                    outbox.insert(), outbox_values(message, session_id=None, run_id=None, event_id=None)
                )
            srv.runtime.sender.notify()
            [row] = await wait_outbox_final(srv.runtime)
    assert (row["status"], row["attempts"]) == ("sent", 2)
    first, second = bridge.actions
    assert first.params == second.params  # the same message, sent again after the failure
    assert second.params["message"] == [
        {"type": "text", "data": {"text": "The chart:"}},
        {"type": "image", "data": {"file": "base64://" + base64.b64encode(PIXEL).decode()}},
    ]


async def test_a_long_turn_shows_one_working_notice_then_the_answer(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content="Done at last.", delay=1.0)) as llm:
        async with (
            serve(
                **LOCAL_MEDIA,
                channel_settings={"onebot": onebot_settings(working_notice_seconds=0.2, locale="zh")},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
            ) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            srv.runtime.previews.typing_interval = 0.05  # the hub's tick (4 s in production)
            await bridge.send_event(private_message(BOT, 559, "think hard"))
            actions = await bridge.wait_for_actions(2)
    texts = [a.params["message"][0]["data"]["text"] for a in actions]
    assert texts == ["⏳ 正在处理，请稍候…", "Done at last."]


async def test_http_post_reports_are_fetched_only_when_signed(serve: ServeApp) -> None:
    async with FakeMediaServer() as media, FakeHttpApi(TOKEN) as api:
        media.files["a.png"] = (PIXEL, "image/png")
        for secret, fetched in ((SECRET, ["a.png"]), (None, [])):
            media.downloads.clear()
            settings = onebot_settings(secret=secret, http_api_url=api.url)
            async with (
                serve(**LOCAL_MEDIA, channel_settings={"onebot": settings}) as srv,
                httpx.AsyncClient(timeout=30) as client,
            ):
                event = private_message(BOT, 560, [_image(media, "a.png")])
                resp = await _post(client, srv, event, **({"sign": secret} if secret else {}))
                assert resp.status_code == 204, resp.text
                async with srv.runtime.engine.connect() as conn:
                    query = select(inbox.c.payload).order_by(inbox.c.id.desc()).limit(1)
                    payload = (await conn.execute(query)).scalar_one()
            assert media.downloads == fetched
            [image] = payload["parts"]
            # Unsigned: the URL stays a reference (anyone could have posted it).
            assert bool(image.get("data_base64")) == bool(fetched)
            assert (image.get("url") is None) == bool(fetched)
