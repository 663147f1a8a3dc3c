"""DingTalk media: a picture reaches the model as bytes (download code → messageFiles/download → GET)."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx

from app.db.models import inbox, outbox
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from tests.channels.dingtalk.support import dingtalk_settings, post_message
from tests.channels.support import count, llm_settings, wait_outbox_final
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


REPORT = b"%PDF-1.4\n% a tiny report\n"


def _reply_with_media(chat_id: str, **metadata: Any) -> OutboundMessage:
    return OutboundMessage(
        channel="dingtalk",
        chat_id=chat_id,
        session_key=f"dingtalk:{chat_id}",
        parts=(
            TextPart(text="Here is the chart and the report."),
            ImagePart(data_base64=base64.b64encode(PIXEL).decode(), mime_type="image/png"),
            FilePart(
                data_base64=base64.b64encode(REPORT).decode(), name="report.pdf", mime_type="application/pdf"
            ),
        ),
        metadata=metadata,
    )


async def _enqueue(srv: Any, message: OutboundMessage) -> None:
    async with srv.runtime.engine.begin() as conn:
        await conn.execute(
            outbox.insert(), outbox_values(message, session_id=None, run_id=None, event_id=None)
        )
    srv.runtime.sender.notify()


async def test_reply_media_are_uploaded_then_sent_and_an_outage_is_retried(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        fake.fail(dt.MEDIA_UPLOAD, None, dt.BUSY)  # the file upload fails once, after text and image
        settings = dingtalk_settings(fake, oapi_base=fake.url)
        async with serve(channel_settings={"dingtalk": settings}, outbox_backoff_base_seconds=0.05) as srv:
            await _enqueue(srv, _reply_with_media("cidTEAM=="))
            [row] = await wait_outbox_final(srv.runtime)
    assert (row["status"], row["attempts"]) == ("sent", 2)
    sent = fake.delivered()
    assert [c.body["msgKey"] for c in sent] == ["sampleText", "sampleImageMsg", "sampleFile"], "none repeated"
    assert all(c.path == dt.GROUP_SEND and c.body["openConversationId"] == "cidTEAM==" for c in sent)
    assert [c.ok for c in fake.calls_of(dt.MEDIA_UPLOAD)] == [True, False, True]
    assert [c.query["type"] for c in fake.calls_of(dt.MEDIA_UPLOAD)] == ["image", "file", "file"]
    image = json.loads(sent[1].body["msgParam"])
    document = json.loads(sent[2].body["msgParam"])
    assert fake.media[image["photoURL"]].data == PIXEL
    assert fake.media[document["mediaId"]].data == REPORT
    assert (document["fileName"], document["fileType"]) == ("report.pdf", "pdf")
    assert fake.media[document["mediaId"]].name == "report.pdf"


async def test_a_sender_reached_only_by_session_webhook_is_told_the_file_name(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        settings = dingtalk_settings(fake, oapi_base=fake.url, locale="zh")
        webhook_meta = {
            "reply_session_webhook": fake.webhook_url,
            "reply_session_webhook_expires_ms": 4_000_000_000_000,
            "reply_webhook_only": True,
        }
        async with serve(channel_settings={"dingtalk": settings}) as srv:
            await _enqueue(srv, _reply_with_media("cidGUEST-1", **webhook_meta))
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "sent"
    assert not fake.calls_of(dt.MEDIA_UPLOAD) and not fake.media
    texts = [c.body["text"]["content"] for c in fake.delivered()]
    assert texts[0] == "Here is the chart and the report."
    assert texts[1].startswith("📎 image.png") and texts[2].startswith("📎 report.pdf（")


async def test_an_upload_refused_for_its_token_gets_a_fresh_token_once(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        fake.fail(dt.MEDIA_UPLOAD, dt.Failure(200, "40014", "不合法的access_token"))
        settings = dingtalk_settings(fake, oapi_base=fake.url)
        async with serve(channel_settings={"dingtalk": settings}) as srv:
            message = _reply_with_media("cidTEAM2==")
            only_image = message.model_copy(update={"parts": message.parts[:2]})
            await _enqueue(srv, only_image)
            [row] = await wait_outbox_final(srv.runtime)
    assert (row["status"], row["attempts"]) == ("sent", 1)
    assert [c.ok for c in fake.calls_of(dt.MEDIA_UPLOAD)] == [False, True]
    assert [c.query["access_token"] for c in fake.calls_of(dt.MEDIA_UPLOAD)] == ["token-1", "token-2"]
    assert [c.body["msgKey"] for c in fake.delivered()] == ["sampleText", "sampleImageMsg"]
