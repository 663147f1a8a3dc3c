"""Discord media: an image attachment reaches the model as bytes; a reply's files are uploaded."""

from __future__ import annotations

import base64
from pathlib import Path

from app.db.models import inbox, outbox
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from tests.channels.discord.support import discord_settings
from tests.channels.support import count, llm_settings, wait_outbox_final
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, Reply

REPORT = b"%PDF-1.4\n% a tiny report\n"


def _attachment(fake: FakeDiscord, name: str, size: int) -> dict[str, object]:
    return {
        "id": "7001",
        "filename": name,
        "size": size,
        "url": fake.cdn_url(name),
        "proxy_url": fake.cdn_url(name),
        "content_type": "image/png",
    }


async def test_image_attachment_reaches_the_model_as_bytes(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content="A pixel.")) as llm, FakeDiscord() as fake:
        fake.cdn["pixel.png"] = PIXEL
        settings = discord_settings(fake, cdn_base=fake.cdn_url(""), streaming="off")
        async with serve(channel_settings={"discord": settings}, **llm_settings(llm, llm_vision=True)) as srv:
            await fake.wait_ready()
            attachment = _attachment(fake, "pixel.png", len(PIXEL))
            await fake.dispatch(
                "MESSAGE_CREATE", dc.message("what is this?", channel_id="2201", attachments=[attachment])
            )
            await wait_outbox_final(srv.runtime)
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]
    urls = [c["image_url"]["url"] for c in user["content"] if c["type"] == "image_url"]
    assert urls == ["data:image/png;base64," + base64.b64encode(PIXEL).decode()]
    assert [c.body["content"] for c in fake.messages()] == ["A pixel."]


async def test_too_large_attachment_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        fake.cdn["big.png"] = PIXEL * 10
        settings = discord_settings(fake, cdn_base=fake.cdn_url(""), media_max_bytes=len(PIXEL))
        async with serve(channel_settings={"discord": settings}) as srv:
            await fake.wait_ready()
            attachment = _attachment(fake, "big.png", len(PIXEL) * 10)
            await fake.dispatch(
                "MESSAGE_CREATE", dc.message("look", channel_id="2202", attachments=[attachment])
            )
            [reply] = await fake.wait_for_messages(1)
            assert await count(srv.runtime, inbox) == 0
    assert reply.path == "/channels/2202/messages"
    assert "too large" in reply.body["content"]


async def test_reply_files_are_uploaded_as_attachments_and_an_outage_is_retried(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        fake.upload_script.append(dc.SERVER_ERROR)  # the first upload fails, after the text went out
        settings = discord_settings(fake, gateway=False)
        async with serve(channel_settings={"discord": settings}, outbox_backoff_base_seconds=0.05) as srv:
            message = OutboundMessage(
                channel="discord",
                chat_id="2203",
                session_key="discord:2203",
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
    texts = [c.body.get("content") for c in fake.messages() if "content" in c.body]
    assert texts == ["Here is the chart and the report."]  # not repeated by the retry
    assert [(u.path, u.filename, u.data) for u in fake.uploads] == [
        ("/channels/2203/messages", "image.png", PIXEL),
        ("/channels/2203/messages", "report.pdf", REPORT),
    ]
    assert all(u.payload["enforce_nonce"] and u.payload["attachments"][0]["id"] == 0 for u in fake.uploads)


async def test_a_document_attachment_is_kept_in_the_sessions_workspace(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=Reply(content="Read it.")) as llm, FakeDiscord() as fake:
        fake.cdn["report.pdf"] = REPORT
        settings = discord_settings(fake, cdn_base=fake.cdn_url(""), streaming="off")
        workspace = {"workspace_root": str(tmp_path), "workspace_per_session": True}
        async with serve(channel_settings={"discord": settings}, **llm_settings(llm, **workspace)) as srv:
            await fake.wait_ready()
            attachment = {**_attachment(fake, "report.pdf", len(REPORT)), "content_type": "application/pdf"}
            await fake.dispatch(
                "MESSAGE_CREATE", dc.message("summarise", channel_id="2204", attachments=[attachment])
            )
            await wait_outbox_final(srv.runtime)
    [saved] = list(tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)
    assert saved.read_bytes() == REPORT and saved.name.endswith("-report.pdf")
    [request] = llm.requests
    user = [m for m in request.messages if m["role"] == "user"][-1]["content"]
    assert f"saved in your workspace as inbox/{saved.name}" in user
