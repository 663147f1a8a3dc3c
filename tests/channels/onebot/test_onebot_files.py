"""`file`, `video` and `record` segments (with a `url`, as NapCat / go-cqhttp report them)
downloaded under `ONEBOT_MEDIA_MAX_BYTES` and kept in the session's workspace
(per-session workspaces on); too large → a polite reply, nothing stored; an unsigned HTTP
POST report's URLs are still never fetched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.onebot.test_onebot import BOT, TOKEN, _post, onebot_settings, ws_url
from tests.channels.support import LOCAL_MEDIA, count, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes.media_server import FakeMediaServer
from tests.fakes.onebot import FakeBridge, FakeHttpApi, private_message
from tests.fakes.openai_server import FakeOpenAI, text

REPORT = b"%PDF-1.4\n% a tiny report\n"
CLIP = b"\x00\x00\x00\x18ftypmp42 a tiny clip"
VOICE = b"#!AMR\n fake voice"


def _segment(kind: str, media: FakeMediaServer, name: str, size: int) -> dict[str, Any]:
    """A received media segment as NapCat reports it: the name in `file`, a download `url`."""
    return {"type": kind, "data": {"file": name, "file_id": f"id-{name}", "file_size": str(size),
                                   "url": media.url_of(name)}}  # fmt: skip


def _saved(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("inbox/*"))


async def test_file_video_and_record_segments_are_kept_in_the_sessions_workspace(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeMediaServer() as media, FakeOpenAI() as llm:
        media.files["report.pdf"] = (REPORT, "application/pdf")
        media.files["clip.mp4"] = (CLIP, "video/mp4")
        media.files["note.amr"] = (VOICE, "application/octet-stream")
        llm.enqueue(text("Got your report."), text("Got the clip and the note."))
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(**LOCAL_MEDIA, channel_settings={"onebot": onebot_settings()}, **settings) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            message = [{"type": "text", "data": {"text": "please summarise"}},
                       _segment("file", media, "report.pdf", len(REPORT))]  # fmt: skip
            await bridge.send_event(private_message(BOT, 555, message, message_id=7001))
            await wait_outbox_final(srv.runtime)
            message = [_segment("video", media, "clip.mp4", len(CLIP)),
                       _segment("record", media, "note.amr", len(VOICE))]  # fmt: skip
            await bridge.send_event(private_message(BOT, 555, message, message_id=7002))
            await wait_outbox_final(srv.runtime, count=2)
            async with srv.runtime.engine.connect() as conn:
                query = select(messages.c.parts).where(messages.c.role == "user").order_by(messages.c.id)
                stored = [r[0] for r in await conn.execute(query)]
    assert media.downloads == ["report.pdf", "clip.mp4", "note.amr"]
    saved = _saved(tmp_path)
    assert [s.split("/inbox/")[1] for s in saved] == [
        f"{BOT}_7001-report.pdf",
        f"{BOT}_7002-clip.mp4",
        f"{BOT}_7002-note.amr",
    ]
    assert len({s.split("/inbox/")[0] for s in saved}) == 1  # one user, one session
    assert [(tmp_path / s).read_bytes() for s in saved] == [REPORT, CLIP, VOICE]
    [part] = stored[0]
    assert part["workspace_path"] == f"inbox/{BOT}_7001-report.pdf" and part["data_base64"] is None
    assert part["mime_type"] == "application/pdf" and part["size"] == len(REPORT)
    assert [p["mime_type"] for p in stored[1]] == ["video/mp4", "audio/amr"]
    first_user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "please summarise" in first_user
    assert f"saved in your workspace as inbox/{BOT}_7001-report.pdf" in first_user


async def test_a_too_large_file_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeMediaServer() as media, FakeOpenAI() as llm:
        media.files["backup.zip"] = (b"x" * 5000, "application/zip")
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(
                **LOCAL_MEDIA,
                channel_settings={"onebot": onebot_settings(media_max_bytes=1000, locale="zh")},
                **settings,
            ) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            message = [_segment("file", media, "backup.zip", 5000)]
            await bridge.send_event(private_message(BOT, 556, message))
            [action] = await bridge.wait_for_actions(1)
            assert await count(srv.runtime, inbox) == 0
    assert (action.action, action.params["user_id"]) == ("send_private_msg", 556)
    assert "太大" in action.params["message"][0]["data"]["text"]
    assert llm.requests == []
    assert _saved(tmp_path) == []


async def test_an_unsigned_http_post_reports_file_is_not_fetched(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeMediaServer() as media, FakeHttpApi(TOKEN) as api, FakeOpenAI() as llm:
        media.files["report.pdf"] = (REPORT, "application/pdf")
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        channel = onebot_settings(secret=None, http_api_url=api.url)
        async with (
            serve(**LOCAL_MEDIA, channel_settings={"onebot": channel}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = private_message(BOT, 557, [_segment("file", media, "report.pdf", len(REPORT))])
            resp = await _post(client, srv, event)
            assert resp.status_code == 204, resp.text
            async with srv.runtime.engine.connect() as conn:
                query = select(inbox.c.payload).order_by(inbox.c.id.desc()).limit(1)
                payload = (await conn.execute(query)).scalar_one()
    assert media.downloads == []
    [part] = payload["parts"]
    assert part["url"] == media.url_of("report.pdf") and not part.get("data_base64")
