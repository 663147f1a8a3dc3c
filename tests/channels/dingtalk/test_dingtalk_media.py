"""DingTalk media: a picture reaches the model as bytes (download code → messageFiles/download → GET)."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from app.db.models import inbox
from tests.channels.dingtalk.support import dingtalk_settings, post_message
from tests.channels.discord.test_discord_streaming import llm_settings
from tests.channels.support import count, wait_outbox_final
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.openai_server import FakeOpenAI, Reply


def _picture(fake: FakeDingTalk, code: str) -> dict[str, Any]:
    message = dt.robot_message("", webhook=fake.webhook_url)
    del message["text"]
    message["msgtype"] = "picture"
    message["content"] = {"downloadCode": code, "pictureDownloadCode": f"p-{code}"}
    return message


async def test_picture_reaches_the_model_as_bytes(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content="A pixel.")) as llm, FakeDingTalk() as fake:
        fake.files["code-pixel"] = PIXEL
        async with (
            serve(
                channel_settings={"dingtalk": dingtalk_settings(fake)}, **llm_settings(llm, llm_vision=True)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_message(client, srv.url, _picture(fake, "code-pixel"))
            assert resp.status_code == 200, resp.text
            await wait_outbox_final(srv.runtime)
    [asked] = [c for c in fake.calls_of(dt.DOWNLOAD_PATH) if c.ok]
    assert asked.body == {"downloadCode": "code-pixel", "robotCode": dt.CLIENT_ID}
    assert asked.headers["x-acs-dingtalk-access-token"].startswith("token-")
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(PIXEL).decode()]
    assert [c.body["text"]["content"] for c in fake.delivered()] == ["A pixel."]


async def test_too_large_picture_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        fake.files["code-big"] = PIXEL * 10
        settings = dingtalk_settings(fake, media_max_bytes=len(PIXEL))
        async with (
            serve(channel_settings={"dingtalk": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_message(client, srv.url, _picture(fake, "code-big"))
            assert resp.json()["ignored"] == "media too large"
            assert await count(srv.runtime, inbox) == 0
    [reply] = fake.delivered()
    assert "too large" in reply.body["text"]["content"]


async def test_voice_message_uses_dingtalks_transcript(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        message = dt.robot_message("", webhook=fake.webhook_url)
        del message["text"]
        message["msgtype"] = "audio"
        message["content"] = {"duration": 2000, "downloadCode": "code-voice", "recognition": "hello there"}
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_message(client, srv.url, message)
            await wait_outbox_final(srv.runtime)
    assert [c.body["text"]["content"] for c in fake.delivered()] == ["You said: hello there"]
