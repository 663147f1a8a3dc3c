"""Slack voice: an audio clip (a `file_share` whose file has an audio mimetype) is a file
part; with speech to text (`STT_MODEL`) it is downloaded with the bot token and
transcribed, and the transcript is the user's text. Too large: a polite reply, nothing
stored, nothing transcribed."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from app.db.models import inbox, messages
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import count, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.slack import FakeSlack

CLIP = b"\x1aE\xdf\xa3 webm opus audio clip"


def _clip(fake: FakeSlack, file_id: str, data: bytes, mime: str = "audio/webm") -> list[dict[str, Any]]:
    """An audio clip recorded in Slack, as the file object of its `file_share` message."""
    path = f"T0001-{file_id}/audio_message.webm"
    fake.files[path] = data
    return [{"id": file_id, "name": "audio_message.webm", "title": "audio_message.webm",
             "mimetype": mime, "filetype": "webm", "subtype": "slack_audio",
             "media_display_type": "audio", "size": len(data),
             "url_private": fake.files_url + path}]  # fmt: skip


def _stt(llm: FakeOpenAI, **extra: Any) -> dict[str, Any]:
    return dict(llm_provider="openai", llm_base_url=llm.url, llm_api_key="sk-test", llm_model="fake-model",
                stt_model="whisper-1", **extra)  # fmt: skip


@pytest.mark.parametrize(("sent", "seen"), [("audio/webm", "audio/webm"), ("video/mp4", "audio/mp4")])
async def test_an_audio_clip_is_transcribed_and_the_transcript_is_the_users_text(
    serve: ServeApp, sent: str, seen: str
) -> None:
    async with FakeOpenAI(default=Reply(content="Noted.")) as llm, FakeSlack() as fake:
        llm.transcript = "remind me to buy milk"
        settings = slack_settings(fake, files_base_url=fake.files_url, streaming="off")
        async with (
            serve(channel_settings={"slack": settings}, **_stt(llm)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.dm("", subtype="file_share", files=_clip(fake, "F0CLIP", CLIP, sent))
            resp = await post_event(client, srv.url, sl.event_callback(event))
            assert resp.status_code == 200, resp.text
            await wait_outbox_final(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                query = select(messages.c.content, messages.c.parts).where(messages.c.role == "user")
                [(content, parts)] = (await conn.execute(query)).all()
    [download] = fake.calls_of("download")
    assert download.headers["authorization"] == f"Bearer {fake.token}"
    assert llm.transcriptions == [{"model": "whisper-1", "audio": CLIP}]
    [request] = llm.requests
    assert "remind me to buy milk" in str([m for m in request.messages if m["role"] == "user"][-1]["content"])
    assert content == "remind me to buy milk"
    [part] = parts
    assert (part["type"], part["mime_type"], part["name"]) == ("file", seen, "audio_message.webm")
    assert base64.b64decode(part["data_base64"]) == CLIP
    assert [p["text"] for p in fake.posted()] == ["Noted."]


async def test_an_audio_clip_is_kept_in_the_sessions_workspace_too(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI(default=Reply(content="Noted.")) as llm, FakeSlack() as fake:
        llm.transcript = "call the bank"
        settings = slack_settings(fake, files_base_url=fake.files_url, streaming="off")
        extra = _stt(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(channel_settings={"slack": settings}, **extra) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.dm("", subtype="file_share", files=_clip(fake, "F0CLIP2", CLIP))
            resp = await post_event(client, srv.url, sl.event_callback(event, event_id="Ev0CLIP"))
            assert resp.status_code == 200, resp.text
            await wait_outbox_final(srv.runtime)
    [saved] = list(tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)
    assert saved.read_bytes() == CLIP and saved.name.endswith("-audio_message.webm")
    assert len(llm.transcriptions) == 1
    user = str([m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"])
    assert "call the bank" in user and f"saved in your workspace as inbox/{saved.name}" in user


async def test_a_too_large_audio_clip_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeOpenAI() as llm, FakeSlack() as fake:
        settings = slack_settings(fake, files_base_url=fake.files_url, media_max_bytes=len(CLIP) - 1)
        async with (
            serve(channel_settings={"slack": settings}, **_stt(llm)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.dm("", subtype="file_share", files=_clip(fake, "F0BIGCLIP", CLIP))
            resp = await post_event(client, srv.url, sl.event_callback(event))
            assert resp.json()["ignored"] == "media too large"
            assert await count(srv.runtime, inbox) == 0
    assert llm.transcriptions == [] and llm.requests == []
    [reply] = fake.posted()
    assert "too large" in reply["text"]
