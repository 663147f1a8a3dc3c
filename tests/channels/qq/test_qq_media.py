"""QQ media against the fake platform and a fake CDN: attachments downloaded before the
event is stored, voice as the platform's transcript (`asr_refer_text`) or through speech to
text, a too-large file answered politely, replies' images uploaded with retries."""

from __future__ import annotations

import base64

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages, outbox
from app.events import ImagePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from channels.qq import QQChannel
from tests.channels.qq.test_qq import APP_ID, SECRET, _post, qq_settings
from tests.channels.support import LOCAL_MEDIA, count, send_only_context, wait_outbox_final
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes.media_server import FakeMediaServer
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.qq import QQPlatform, c2c_message


async def _user_rows(srv: object) -> list[tuple[str, list[dict[str, object]]]]:
    async with srv.runtime.engine.connect() as conn:  # type: ignore[attr-defined]
        query = select(messages.c.content, messages.c.parts).where(messages.c.role == "user")
        return [(r.content, r.parts) for r in await conn.execute(query)]


async def test_inbound_image_reaches_the_model_as_its_bytes(serve: ServeApp) -> None:
    async with (
        QQPlatform(APP_ID, SECRET) as platform,
        FakeMediaServer() as cdn,
        FakeOpenAI(default=Reply(content="A tiny pixel.")) as llm,
    ):
        cdn.files["pixel.png"] = (PIXEL, "image/png")
        async with (
            serve(
                **LOCAL_MEDIA,
                channel_settings={"qq": qq_settings(platform)},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                llm_vision=True,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            picture = {"content_type": "image/png", "filename": "pixel.png", "url": cdn.url_of("pixel.png")}
            resp = await _post(client, srv, c2c_message("OPENID_M", "what is it?", attachments=[picture]))
            assert resp.status_code == 200, resp.text
            [sent] = await platform.wait_for(1)
    assert cdn.downloads == ["pixel.png"]
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(PIXEL).decode()]
    assert sent.body["content"] == "A tiny pixel."


async def test_too_large_image_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform, FakeMediaServer() as cdn:
        cdn.files["big.jpg"] = (b"x" * 5000, "image/jpeg")
        async with (
            serve(**LOCAL_MEDIA, channel_settings={"qq": qq_settings(platform, media_max_bytes=1000)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            picture = {"content_type": "image/jpeg", "url": cdn.url_of("big.jpg")}
            event = c2c_message("OPENID_B", "", message_id="MSG-BIG", attachments=[picture])
            resp = await _post(client, srv, event)
            assert resp.status_code == 200, resp.text
            [sent] = await platform.wait_for(1)
            assert await count(srv.runtime, inbox) == 0
    assert sent.path == "/v2/users/OPENID_B/messages"
    assert "too large" in sent.body["content"]
    assert sent.body["msg_id"] == "MSG-BIG"  # a passive reply to the refused message


async def test_voice_uses_the_platforms_transcript_or_speech_to_text(serve: ServeApp) -> None:
    wav = b"RIFF fake wav"
    async with (
        QQPlatform(APP_ID, SECRET) as platform,
        FakeMediaServer() as cdn,
        FakeOpenAI(default=Reply(content="Noted.")) as llm,
    ):
        cdn.files["v.wav"] = (wav, "audio/wav")
        llm.transcript = "water the plants"
        async with (
            serve(
                **LOCAL_MEDIA,
                channel_settings={"qq": qq_settings(platform)},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                stt_model="whisper-1",
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            with_asr = {"content_type": "voice", "url": "cdn.example/v.silk", "asr_refer_text": "明天见"}
            await _post(client, srv, c2c_message("OPENID_V", "", attachments=[with_asr]))
            await platform.wait_for(1)
            without = {
                "content_type": "voice",
                "url": "cdn.example/v2.silk",
                "voice_wav_url": cdn.url_of("v.wav"),
            }
            await _post(client, srv, c2c_message("OPENID_V", "", attachments=[without]))
            await platform.wait_for(2)
            rows = await _user_rows(srv)
    assert [content for content, _ in rows] == ["明天见", "water the plants"]
    assert llm.transcriptions == [{"model": "whisper-1", "audio": wav}]  # only the second
    audio = rows[1][1][-1]
    assert (audio["type"], audio["mime_type"]) == ("file", "audio/wav")
    assert base64.b64decode(str(audio["data_base64"])) == wav


async def test_outbound_image_upload_is_retried_after_an_outage(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform:
        platform.upload_failures = 1
        async with serve(
            channel_settings={"qq": qq_settings(platform)}, outbox_backoff_base_seconds=0.05
        ) as srv:
            message = OutboundMessage(
                channel="qq",
                chat_id="user:OPENID_O",
                session_key="qq:user%3AOPENID_O",
                parts=(
                    TextPart(text="The chart:"),
                    ImagePart(data_base64=base64.b64encode(PIXEL).decode(), mime_type="image/png"),
                ),
            )
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(
                    outbox.insert(), outbox_values(message, session_id=None, run_id=None, event_id=None)
                )
            srv.runtime.sender.notify()
            [row] = await wait_outbox_final(srv.runtime)
    assert (row["status"], row["attempts"]) == ("sent", 2)
    assert platform.upload_attempts == 2
    [upload] = platform.uploads
    assert base64.b64decode(upload.body["file_data"]) == PIXEL
    assert [s.body.get("content") or s.body.get("media") for s in platform.sent] == [
        "The chart:",  # not repeated by the retry
        {"file_info": "file-info-1"},
    ]


async def test_attachment_urls_without_a_scheme_get_https() -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        channel = QQChannel(qq_settings(), send_only_context(http))
        picture = {"content_type": "image/jpeg", "url": "multimedia.nt.qq.com.cn/download?fileid=abc"}
        voice = {"content_type": "voice", "url": "x", "voice_wav_url": "//cdn.example/v.wav"}
        event = channel.parse_message(c2c_message("OPENID_S", "", attachments=[picture, voice]))
    image, audio = event.parts
    assert isinstance(image, ImagePart) and image.url == "https://multimedia.nt.qq.com.cn/download?fileid=abc"
    assert audio.url == "https://cdn.example/v.wav"  # type: ignore[union-attr]
