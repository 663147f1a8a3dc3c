"""Official Account media and typing against the fake WeChat API: images fetched by MediaId
(`media/get`), voice with WeChat's `Recognition` as the user's text, replies' images
uploaded as temporary media through the outbox, and the "typing" state while a turn runs."""

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
from tests.channels.wechat_mp.test_wechat_mp import AES_KEY, APP_ID, TOKEN, _post, mp_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.wechat_mp import FakeWeChatMpApi, WeChatMpCallbacks


@pytest.fixture
async def api() -> AsyncIterator[FakeWeChatMpApi]:
    async with FakeWeChatMpApi(app_id=APP_ID) as fake:
        yield fake


@pytest.fixture
def wechat() -> WeChatMpCallbacks:
    return WeChatMpCallbacks(TOKEN, APP_ID, AES_KEY)


async def test_inbound_image_reaches_the_model_as_its_bytes_and_typing_is_shown(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    api.media["IMG1"] = (PIXEL, "image/jpeg")
    async with (
        # The answer waits for the typing indicator: a turn quicker than the indicator's
        # start shows none, which is right, and not what this test looks at.
        FakeOpenAI(default=Reply(content="A tiny pixel.", hold=api.typed)) as llm,
        serve(
            channel_settings={"wechat-mp": mp_settings(api)},
            llm_provider="openai",
            llm_base_url=llm.url,
            llm_api_key="sk-test",
            llm_model="fake-model",
            llm_vision=True,
        ) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(client, srv.url, wechat.plaintext(wechat.image("openid-1", "IMG1", 21)))
        assert resp.status_code == 200, resp.text
        assert resp.text == "success"
        [sent] = await api.wait_for_sent(1)
    assert api.media_gets == ["IMG1"]
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/jpeg;base64," + base64.b64encode(PIXEL).decode()]
    assert "mmbiz.qpic.cn" not in str(request.body)
    assert sent.body["text"]["content"] == "A tiny pixel."
    assert api.typing == [{"touser": "openid-1", "command": "Typing"}]  # once: it lasts 15 s


async def test_voice_with_recognition_is_stored_as_the_users_text_without_a_download(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    async with (
        serve(channel_settings={"wechat-mp": mp_settings(api, streaming="off")}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(client, srv.url, wechat.plaintext(wechat.voice("openid-2", "明天会下雨吗", 22)))
        assert resp.status_code == 200, resp.text
        await api.wait_for_sent(1)
        async with srv.runtime.engine.connect() as conn:
            [(content,)] = (
                await conn.execute(select(messages.c.content).where(messages.c.role == "user"))
            ).all()
    assert content == "明天会下雨吗"
    assert api.media_gets == []
    assert api.typing == []  # WECHAT_MP_STREAMING=off


async def test_too_large_image_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    api.media["BIG"] = (b"x" * 5000, "image/jpeg")
    settings = mp_settings(api, media_max_bytes=1000)
    async with (
        serve(channel_settings={"wechat-mp": settings}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(client, srv.url, wechat.plaintext(wechat.image("openid-3", "BIG", 23)))
        assert resp.status_code == 200, resp.text
        [sent] = await api.wait_for_sent(1)
        assert await count(srv.runtime, inbox) == 0
    assert sent.body["touser"] == "openid-3"
    assert "too large" in sent.body["text"]["content"]


async def test_outbound_image_is_uploaded_and_an_outage_is_retried(
    serve: ServeApp, api: FakeWeChatMpApi
) -> None:
    api.upload_failures = 1
    async with serve(
        channel_settings={"wechat-mp": mp_settings(api)}, outbox_backoff_base_seconds=0.05
    ) as srv:
        message = OutboundMessage(
            channel="wechat-mp",
            chat_id="openid-4",
            session_key="wechat-mp:openid-4",
            parts=(
                TextPart(text="Here is the chart."),
                ImagePart(data_base64=base64.b64encode(PIXEL).decode(), mime_type="image/png"),
                FilePart(data_base64=base64.b64encode(b"%PDF").decode(), name="report.pdf"),
            ),
        )
        async with srv.runtime.engine.begin() as conn:
            await conn.execute(
                outbox.insert(), outbox_values(message, session_id=None, run_id=None, event_id=None)
            )
        srv.runtime.sender.notify()
        [row] = await wait_outbox_final(srv.runtime)
    assert (row["status"], row["attempts"]) == ("sent", 2)
    assert [(u.kind, u.data) for u in api.uploads] == [("image", PIXEL)]
    bodies = [c.body for c in api.sent]
    # The text once (the file has no Official Account message type: named in the text).
    assert bodies[0] == {
        "touser": "openid-4",
        "msgtype": "text",
        "text": {"content": "Here is the chart.\n[report.pdf]"},
    }
    assert bodies[1:] == [{"touser": "openid-4", "msgtype": "image", "image": {"media_id": "uploaded-1"}}]


def test_previews_are_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="cannot edit a sent message"):
        mp_settings(FakeWeChatMpApi(), streaming="edit")
