"""Photos sent to the bot reach the model as image data (getFile + download), under a size limit."""

from __future__ import annotations

import base64

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages
from tests.channels.support import count, wait_outbox_final
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram import FakeTelegram

# The smallest valid PNG: a 1x1 transparent pixel.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def _photo(file_id: str, size: int) -> list[dict[str, object]]:
    return [
        {"file_id": file_id + "s", "file_unique_id": "us", "width": 90, "height": 90, "file_size": 10},
        {"file_id": file_id, "file_unique_id": "u" + file_id, "width": 800, "height": 800, "file_size": size},
    ]


async def test_inbound_photo_reaches_the_model_as_image_bytes(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content="A tiny pixel.")) as llm, FakeTelegram() as fake:
        fake.files["PHOTO1"] = PIXEL
        async with (
            serve(
                channel_settings={"telegram": tg_settings(fake, streaming="off")},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                llm_vision=True,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            msg = tg.message(None, photo=_photo("PHOTO1", len(PIXEL)), caption="what is this?")
            resp = await post_update(client, srv.url, tg.update(600, msg))
            assert resp.status_code == 200
            await wait_outbox_final(srv.runtime)
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/jpeg;base64," + base64.b64encode(PIXEL).decode()]
    assert "telegram-file:" not in str(request.body)
    assert fake.sent_texts() == ["A tiny pixel."]


async def test_too_large_photo_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        fake.files["BIG"] = b"x" * 5000
        async with (
            serve(channel_settings={"telegram": tg_settings(fake, media_max_bytes=1000)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_update(
                client, srv.url, tg.update(601, tg.message(None, photo=_photo("BIG", 5000)))
            )
            assert resp.status_code == 200
            assert resp.json()["ignored"] == "media too large"
            assert await count(srv.runtime, inbox) == 0
    [text] = fake.sent_texts()
    assert "too large" in text
    assert not fake.calls_of("download")


async def test_voice_note_is_transcribed_and_the_transcript_is_the_users_text(serve: ServeApp) -> None:
    audio = b"OggS\x00fake-opus-voice-note"
    async with FakeOpenAI(default=Reply(content="Noted.")) as llm, FakeTelegram() as fake:
        fake.files["VOICE1"] = audio
        llm.transcript = "remind me to buy milk"
        async with (
            serve(
                channel_settings={"telegram": tg_settings(fake, streaming="off")},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                stt_model="whisper-1",
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            voice = {"file_id": "VOICE1", "file_unique_id": "uv", "duration": 2, "mime_type": "audio/ogg"}
            resp = await post_update(client, srv.url, tg.update(610, tg.message(None, voice=voice)))
            assert resp.status_code == 200
            await wait_outbox_final(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                [(content, parts)] = (
                    await conn.execute(
                        select(messages.c.content, messages.c.parts).where(messages.c.role == "user")
                    )
                ).all()
    assert llm.transcriptions == [{"model": "whisper-1", "audio": audio}]
    [request] = llm.requests
    assert "remind me to buy milk" in str([m for m in request.messages if m["role"] == "user"][-1]["content"])
    assert content == "remind me to buy milk"
    assert parts[0]["type"] == "file" and parts[0]["mime_type"] == "audio/ogg"
    assert base64.b64decode(parts[0]["data_base64"]) == audio
    assert fake.sent_texts() == ["Noted."]
