"""Feishu media: an image message reaches the model as bytes; a reply's files are uploaded, then sent."""

from __future__ import annotations

import base64
import json

import httpx

from app.db.models import inbox, outbox
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from tests.channels.feishu.support import feishu_settings, post_callback
from tests.channels.support import count, llm_settings, wait_outbox_final
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai_server import FakeOpenAI, Reply

REPORT = b"%PDF-1.4\n% a tiny report\n"


async def test_image_message_reaches_the_model_as_bytes(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content="A pixel.")) as llm, FakeFeishu() as fake:
        fake.resources["img_v3_pixel"] = PIXEL
        settings = feishu_settings(fake, streaming="off")
        async with (
            serve(channel_settings={"feishu": settings}, **llm_settings(llm, llm_vision=True)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = fs.message_event("image", {"image_key": "img_v3_pixel"}, chat_id="oc_m1")
            resp = await post_callback(client, srv.url, event)
            assert resp.status_code == 200
            await wait_outbox_final(srv.runtime)
    [download] = fake.calls_of("resource")
    assert download.params == {"type": "image"}
    assert download.path.endswith("/resources/img_v3_pixel")
    assert download.token.startswith("t-")
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(PIXEL).decode()]
    assert [c.text for c in fake.delivered()] == ["A pixel."]


async def test_too_large_image_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        fake.resources["img_v3_big"] = PIXEL * 10
        settings = feishu_settings(fake, media_max_bytes=len(PIXEL), locale="zh")
        async with (
            serve(channel_settings={"feishu": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = fs.message_event("image", {"image_key": "img_v3_big"}, chat_id="oc_m2")
            resp = await post_callback(client, srv.url, event)
            assert resp.status_code == 200 and resp.json()["ignored"] == "media too large"
            assert await count(srv.runtime, inbox) == 0
    [reply] = fake.delivered()
    assert "太大" in reply.text and reply.body["receive_id"] == "oc_m2"


async def test_reply_files_are_uploaded_then_sent_and_an_outage_is_retried(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        fake.fail("file", fs.SERVER_ERROR)  # the file upload fails once, after text and image went out
        async with serve(
            channel_settings={"feishu": feishu_settings(fake)}, outbox_backoff_base_seconds=0.05
        ) as srv:
            message = OutboundMessage(
                channel="feishu",
                chat_id="oc_m3",
                session_key="feishu:oc_m3",
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
    assert row["status"] == "sent"
    assert row["attempts"] == 2
    sent = fake.delivered()
    assert [c.body["msg_type"] for c in sent] == ["text", "image", "file"]  # none repeated by the retry
    assert [c.ok for c in fake.calls_of("image", "file")] == [True, False, True]
    image_key = json.loads(sent[1].body["content"])["image_key"]
    file_key = json.loads(sent[2].body["content"])["file_key"]
    assert fake.uploads[image_key][1] == PIXEL and fake.uploads[image_key][2] == {"image_type": "message"}
    assert fake.uploads[file_key] == ("report.pdf", REPORT, {"file_type": "pdf", "file_name": "report.pdf"})
