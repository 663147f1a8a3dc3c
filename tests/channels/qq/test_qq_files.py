"""Documents and videos a QQ user sends (attachments whose `content_type` is not an
image: "file", "video/mp4"), downloaded from their URL under `QQ_MEDIA_MAX_BYTES` and
kept in the session's workspace (per-session workspaces on), or refused when too large."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.qq.test_qq import APP_ID, SECRET, _post, qq_settings
from tests.channels.support import LOCAL_MEDIA, count, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes.media_server import FakeMediaServer
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.qq import QQPlatform, c2c_message

REPORT = b"%PDF-1.4\n% a tiny report\n"
CLIP = b"\x00\x00\x00\x18ftypmp42 a tiny clip"


def _saved(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("inbox/*"))


async def test_a_document_and_a_video_are_kept_in_the_sessions_workspace(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform, FakeMediaServer() as cdn, FakeOpenAI() as llm:
        # QQ's CDN serves documents as a generic type; the attachment says only "file".
        cdn.files["doc1"] = (REPORT, "application/octet-stream")
        cdn.files["vid1"] = (CLIP, "video/mp4")
        llm.enqueue(text("Got your report."), text("Nice clip."))
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(**LOCAL_MEDIA, channel_settings={"qq": qq_settings(platform)}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            doc = {"content_type": "file", "filename": "report 2026.pdf", "size": len(REPORT),
                   "url": cdn.url_of("doc1")}  # fmt: skip
            event = c2c_message("OPENID_F", "please summarise", message_id="MSG-DOC", attachments=[doc])
            assert (await _post(client, srv, event)).status_code == 200
            await wait_outbox_final(srv.runtime)
            video = {"content_type": "video/mp4", "filename": "clip.mp4", "url": cdn.url_of("vid1")}
            event = c2c_message("OPENID_F", "", message_id="MSG-VID", attachments=[video])
            assert (await _post(client, srv, event)).status_code == 200
            await wait_outbox_final(srv.runtime, count=2)
            async with srv.runtime.engine.connect() as conn:
                query = select(messages.c.parts).where(messages.c.role == "user").order_by(messages.c.id)
                stored = [r[0] for r in await conn.execute(query)]
    assert cdn.downloads == ["doc1", "vid1"]
    first, second = _saved(tmp_path)
    assert first.endswith("/inbox/msg_MSG-DOC-report_2026.pdf")
    assert second.endswith("/inbox/msg_MSG-VID-clip.mp4")
    assert first.split("/inbox/")[0] == second.split("/inbox/")[0]  # one user, one session
    assert (tmp_path / first).read_bytes() == REPORT
    assert (tmp_path / second).read_bytes() == CLIP
    [part] = stored[0]  # the text is the content column
    assert part["workspace_path"] == "inbox/msg_MSG-DOC-report_2026.pdf" and part["data_base64"] is None
    assert part["mime_type"] == "application/octet-stream" and part["size"] == len(REPORT)
    first_user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "please summarise" in first_user
    assert "saved in your workspace as inbox/msg_MSG-DOC-report_2026.pdf" in first_user
    assert [s.body["content"] for s in platform.sent] == ["Got your report.", "Nice clip."]


async def test_a_too_large_document_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform, FakeMediaServer() as cdn, FakeOpenAI() as llm:
        cdn.files["big"] = (b"x" * 5000, "application/zip")
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        qq = qq_settings(platform, media_max_bytes=1000, locale="zh")
        async with (
            serve(**LOCAL_MEDIA, channel_settings={"qq": qq}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            doc = {"content_type": "file", "filename": "backup.zip", "url": cdn.url_of("big")}
            event = c2c_message("OPENID_F", "", message_id="MSG-BIG", attachments=[doc])
            assert (await _post(client, srv, event)).status_code == 200
            [sent] = await platform.wait_for(1)
            assert await count(srv.runtime, inbox) == 0
    assert sent.path == "/v2/users/OPENID_F/messages"
    assert "太大" in sent.body["content"] and sent.body["msg_id"] == "MSG-BIG"
    assert llm.requests == []
    assert _saved(tmp_path) == []
