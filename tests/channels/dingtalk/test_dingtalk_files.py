"""DingTalk files in: `file`, `audio` and `video` messages are downloaded (download code ->
`messageFiles/download` -> temporary URL) and kept in the session's workspace; too large ->
a polite reply and nothing stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.dingtalk.support import dingtalk_settings, post_message
from tests.channels.support import count, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.openai_server import FakeOpenAI, text

REPORT = b"%PDF-1.4\n% a tiny report\n"
VOICE = b"#!AMR\n voice"
VIDEO = b"\x00\x00\x00\x18ftypmp42 video"


def _message(fake: FakeDingTalk, kind: str, content: dict[str, Any], msg_id: str) -> dict[str, Any]:
    message = dt.robot_message("", webhook=fake.webhook_url, msg_id=msg_id)
    del message["text"]
    message["msgtype"] = kind
    message["content"] = content
    return message


async def test_a_file_a_voice_note_and_a_video_are_kept_in_the_sessions_workspace(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as llm, FakeDingTalk() as fake:
        fake.files.update({"code-report": REPORT, "code-voice": VOICE, "code-video": VIDEO})
        llm.enqueue(text("Got your report."), text("Got your voice note."), text("Got your video."))
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        file = {"downloadCode": "code-report", "fileName": "report 2026.pdf", "fileId": "f1", "spaceId": "s1"}
        voice = {"duration": 2000, "downloadCode": "code-voice", "recognition": "summarise it please"}
        video = {"duration": 3, "downloadCode": "code-video", "videoType": "mp4"}
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            sent: list[tuple[str, dict[str, Any], str]] = [
                ("file", file, "msgFILE1"),
                ("audio", voice, "msgVOICE1"),
                ("video", video, "msgVIDEO1"),
            ]
            for n, (kind, content, msg_id) in enumerate(sent, start=1):
                resp = await post_message(client, srv.url, _message(fake, kind, content, msg_id))
                assert resp.status_code == 200, resp.text
                await wait_outbox_final(srv.runtime, count=n)
            async with srv.runtime.engine.connect() as conn:
                query = (
                    select(messages.c.content, messages.c.parts)
                    .where(messages.c.role == "user")
                    .order_by(messages.c.id)
                )
                stored = [tuple(r) for r in await conn.execute(query)]
    asked = [c.body["downloadCode"] for c in fake.calls_of(dt.DOWNLOAD_PATH) if c.ok]
    assert asked == ["code-report", "code-voice", "code-video"]
    saved = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)
    names = sorted(s.split("/inbox/")[1] for s in saved)
    assert names == ["msgFILE1-report_2026.pdf", "msgVIDEO1-video.mp4", "msgVOICE1-voice.amr"]
    assert len({s.split("/inbox/")[0] for s in saved}) == 1  # the same session's workspace
    by_name = {s.split("/inbox/")[1]: (tmp_path / s).read_bytes() for s in saved}
    assert by_name == {
        "msgFILE1-report_2026.pdf": REPORT,
        "msgVOICE1-voice.amr": VOICE,
        "msgVIDEO1-video.mp4": VIDEO,
    }
    (_, [report]), (voice_text, [voice_file]), (_, [video_part]) = stored
    assert report["workspace_path"] == "inbox/msgFILE1-report_2026.pdf" and report["data_base64"] is None
    assert report["mime_type"] == "application/pdf" and report["size"] == len(REPORT)
    assert voice_text == "summarise it please"  # DingTalk's own transcript
    assert voice_file["mime_type"] == "audio/amr" and video_part["mime_type"] == "video/mp4"
    first_user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "saved in your workspace as inbox/msgFILE1-report_2026.pdf" in str(first_user)
    replies = [c.body["text"]["content"] for c in fake.delivered()]
    assert replies == ["Got your report.", "Got your voice note.", "Got your video."]


async def test_a_too_large_file_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeDingTalk() as fake:
        fake.files["code-big"] = REPORT * 10
        settings = dingtalk_settings(fake, media_max_bytes=len(REPORT), locale="zh")
        async with (
            serve(
                channel_settings={"dingtalk": settings},
                workspace_root=str(tmp_path),
                workspace_per_session=True,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            message = _message(fake, "file", {"downloadCode": "code-big", "fileName": "big.pdf"}, "msgBIG1")
            resp = await post_message(client, srv.url, message)
            assert resp.json()["ignored"] == "media too large"
            assert await count(srv.runtime, inbox) == 0
    [reply] = fake.delivered()
    assert "太大" in reply.body["text"]["content"]
    assert not list(tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)
