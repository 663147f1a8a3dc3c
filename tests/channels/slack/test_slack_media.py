"""Images shared with the bot: downloaded from url_private with the bot token, seen by the model as data."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from app.db.models import inbox
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import count, wait_outbox_final
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack import FakeSlack


def _shared(fake: FakeSlack, path: str, size: int) -> list[dict[str, Any]]:
    return [
        {
            "id": "F0PIXEL",
            "name": "pixel.png",
            "mimetype": "image/png",
            "size": size,
            "url_private": fake.files_url + path,
        }
    ]


async def test_shared_image_reaches_the_model_as_bytes(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content="A pixel.")) as llm, FakeSlack() as fake:
        fake.files["T0001-F0PIXEL/pixel.png"] = PIXEL
        settings = slack_settings(fake, files_base_url=fake.files_url, streaming="off")
        async with (
            serve(
                channel_settings={"slack": settings},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                llm_vision=True,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.dm("what is this?", files=_shared(fake, "T0001-F0PIXEL/pixel.png", len(PIXEL)))
            resp = await post_event(client, srv.url, sl.event_callback(event))
            assert resp.status_code == 200
            await wait_outbox_final(srv.runtime)
    [download] = fake.calls_of("download")
    assert download.headers["authorization"] == f"Bearer {fake.token}"
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(PIXEL).decode()]
    assert [p["text"] for p in fake.posted()] == ["A pixel."]


async def test_too_large_image_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        fake.files["T0001-F0BIG/big.png"] = b"x" * 5000
        settings = slack_settings(fake, files_base_url=fake.files_url, media_max_bytes=1000)
        async with (
            serve(channel_settings={"slack": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.dm("look", files=_shared(fake, "T0001-F0BIG/big.png", 5000))
            resp = await post_event(client, srv.url, sl.event_callback(event))
            assert resp.json()["ignored"] == "media too large"
            assert await count(srv.runtime, inbox) == 0
    [reply] = fake.posted()
    assert "too large" in reply["text"]
