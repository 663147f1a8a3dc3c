"""WeCom media both ways against the fake WeCom: images and voice fetched by MediaId
(`media/get`) before the event is stored, replies' images and files uploaded as
temporary media (`media/upload`) through the outbox, and the optional "working…" notice."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import select

from app.db.models import inbox, messages, outbox
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from tests.channels.support import count, wait_outbox_final
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.channels.wecom.test_wecom import AES_KEY, AGENT_ID, CORP_ID, TOKEN, _post, wecom_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.wecom import FakeWeComApi, WeComCallbacks

REPORT = b"%PDF-1.4\n% a tiny report\n"


@pytest.fixture
async def api() -> AsyncIterator[FakeWeComApi]:
    async with FakeWeComApi(corp_id=CORP_ID) as fake:
        yield fake


@pytest.fixture
def wecom() -> WeComCallbacks:
    return WeComCallbacks(TOKEN, AES_KEY, CORP_ID, AGENT_ID)


async def test_inbound_image_reaches_the_model_as_its_bytes(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    api.media["IMG1"] = (PIXEL, "image/png")
    async with (
        FakeOpenAI(default=Reply(content="A tiny pixel.")) as llm,
        serve(
            channel_settings={"wecom": wecom_settings(api)},
            llm_provider="openai",
            llm_base_url=llm.url,
            llm_api_key="sk-test",
            llm_model="fake-model",
            llm_vision=True,
        ) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        inner = wecom.image("zhouj", "https://wework.qpic.cn/pic.jpg", 8001, media_id="IMG1")
        resp = await _post(client, srv.url, wecom.post(inner))
        assert resp.status_code == 200, resp.text
        [sent] = await api.wait_for_sent(1)
    assert api.media_gets == ["IMG1"]
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(PIXEL).decode()]
    assert sent.body["text"]["content"] == "A tiny pixel."


async def test_too_large_image_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    api.media["BIG"] = (b"x" * 5000, "image/jpeg")
    settings = wecom_settings(api, media_max_bytes=1000, locale="zh")
    async with serve(channel_settings={"wecom": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
        inner = wecom.image("zhouj", "https://wework.qpic.cn/big.jpg", 8002, media_id="BIG")
        resp = await _post(client, srv.url, wecom.post(inner))
        assert resp.status_code == 200, resp.text
        assert resp.content == b""
        [sent] = await api.wait_for_sent(1)
        assert await count(srv.runtime, inbox) == 0
    assert sent.body["touser"] == "zhouj"
    assert "太大" in sent.body["text"]["content"]


async def test_voice_is_fetched_and_transcribed_when_speech_to_text_is_on(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    audio = b"#!AMR\n fake voice"
    api.media["VOICE1"] = (audio, "audio/amr")
    async with (
        FakeOpenAI(default=Reply(content="Noted.")) as llm,
        serve(
            channel_settings={"wecom": wecom_settings(api)},
            llm_provider="openai",
            llm_base_url=llm.url,
            llm_api_key="sk-test",
            llm_model="fake-model",
            stt_model="whisper-1",
        ) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        llm.transcript = "book a room for friday"
        resp = await _post(client, srv.url, wecom.post(wecom.voice("zhouj", "VOICE1", 8003)))
        assert resp.status_code == 200, resp.text
        await api.wait_for_sent(1)
        async with srv.runtime.engine.connect() as conn:
            [(content, parts)] = (
                await conn.execute(
                    select(messages.c.content, messages.c.parts).where(messages.c.role == "user")
                )
            ).all()
    assert llm.transcriptions == [{"model": "whisper-1", "audio": audio}]
    assert content == "book a room for friday"
    assert parts[0]["type"] == "file" and parts[0]["mime_type"] == "audio/amr"
    assert base64.b64decode(parts[0]["data_base64"]) == audio


async def test_outbound_image_and_file_are_uploaded_and_an_outage_is_retried(
    serve: ServeApp, api: FakeWeComApi
) -> None:
    api.upload_failures = 1  # the first upload fails after the text went out
    async with serve(
        channel_settings={"wecom": wecom_settings(api)}, outbox_backoff_base_seconds=0.05
    ) as srv:
        message = OutboundMessage(
            channel="wecom",
            chat_id="zhouj",
            session_key="wecom:zhouj",
            parts=(
                TextPart(text="Here is the chart and the report."),
                ImagePart(data_base64=base64.b64encode(PIXEL).decode(), mime_type="image/png"),
                FilePart(
                    data_base64=base64.b64encode(REPORT).decode(),
                    name="report.pdf",
                    mime_type="application/pdf",
                ),
            ),
        )
        async with srv.runtime.engine.begin() as conn:
            await conn.execute(
                outbox.insert(), outbox_values(message, session_id=None, run_id=None, event_id=None)
            )
        srv.runtime.sender.notify()
        [row] = await wait_outbox_final(srv.runtime)
    assert (row["status"], row["attempts"]) == ("sent", 2)
    assert api.upload_attempts == 3
    assert [(u.kind, u.filename, u.data) for u in api.uploads] == [
        ("image", "image.png", PIXEL),
        ("file", "report.pdf", REPORT),
    ]
    bodies = [c.body for c in api.sent]
    assert [b["msgtype"] for b in bodies] == ["text", "image", "file"]  # the text not repeated
    assert bodies[1]["image"] == {"media_id": "uploaded-1"}
    assert bodies[2]["file"] == {"media_id": "uploaded-2"}
    assert bodies[2]["agentid"] == AGENT_ID


async def test_a_long_turn_shows_one_working_notice_then_the_answer(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    async with (
        FakeOpenAI(default=Reply(content="Done at last.", delay=1.5)) as llm,
        serve(
            channel_settings={"wecom": wecom_settings(api, working_notice_seconds=0.2)},
            llm_provider="openai",
            llm_base_url=llm.url,
            llm_api_key="sk-test",
            llm_model="fake-model",
        ) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        srv.runtime.previews.typing_interval = 0.05  # the hub's tick (4 s in production)
        resp = await _post(client, srv.url, wecom.post(wecom.text("zhouj", "think hard", 8004)))
        assert resp.status_code == 200, resp.text
        await wait_outbox_final(srv.runtime)
        await api.wait_for_sent(2)
    texts = [c.body["text"]["content"] for c in api.sent]
    assert texts == ["⏳ Working on it…", "Done at last."]
