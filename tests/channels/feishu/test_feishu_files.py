"""Feishu files in: a `file` (or voice / video) message is downloaded from the message's
resources (`?type=file`, tenant token) and kept in the session's workspace; too large ->
a polite reply and nothing stored."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.feishu.support import feishu_settings, post_callback
from tests.channels.support import count, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai_server import FakeOpenAI, text

REPORT = b"%PDF-1.4\n% a tiny report\n"
VOICE = b"OggS\x00\x02 opus voice"


async def test_a_file_and_a_voice_message_are_kept_in_the_sessions_workspace(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as llm, FakeFeishu() as fake:
        fake.resources["file_v3_report"] = REPORT
        fake.resources["file_v3_voice"] = VOICE
        llm.enqueue(text("Got your report."), text("Got your voice note."))
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake, streaming="off")}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            content = {"file_key": "file_v3_report", "file_name": "report 2026.pdf"}
            event = fs.message_event(
                "file", content, chat_id="oc_f1", message_id="om_file1", event_id="ev_file1"
            )
            assert (await post_callback(client, srv.url, event)).status_code == 200
            await wait_outbox_final(srv.runtime)
            voice = {"file_key": "file_v3_voice", "duration": 2000}
            event = fs.message_event(
                "audio", voice, chat_id="oc_f1", message_id="om_voice1", event_id="ev_voice1"
            )
            assert (await post_callback(client, srv.url, event)).status_code == 200
            await wait_outbox_final(srv.runtime, count=2)
            async with srv.runtime.engine.connect() as conn:
                query = select(messages.c.parts).where(messages.c.role == "user").order_by(messages.c.id)
                stored = [r[0] for r in await conn.execute(query)]
    downloads = fake.calls_of("resource")
    assert [(c.path.rsplit("/", 1)[-1], c.params) for c in downloads] == [
        ("file_v3_report", {"type": "file"}), ("file_v3_voice", {"type": "file"})]  # fmt: skip
    assert all(c.token.startswith("t-") for c in downloads)
    saved = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)
    assert [s.split("/inbox/")[1] for s in saved] == ["ev_file1-report_2026.pdf", "ev_voice1-voice.opus"]
    assert saved[0].split("/inbox/")[0] == saved[1].split("/inbox/")[0]  # the same session's workspace
    assert (tmp_path / saved[0]).read_bytes() == REPORT
    assert (tmp_path / saved[1]).read_bytes() == VOICE
    [report], [voice_part] = stored
    assert report["workspace_path"] == "inbox/ev_file1-report_2026.pdf" and report["data_base64"] is None
    assert report["mime_type"] == "application/pdf" and report["size"] == len(REPORT)
    assert voice_part["mime_type"] == "audio/opus"
    first_user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "saved in your workspace as inbox/ev_file1-report_2026.pdf" in str(first_user)
    assert [c.text for c in fake.delivered()] == ["Got your report.", "Got your voice note."]


async def test_a_too_large_file_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeFeishu() as fake:
        fake.resources["file_v3_big"] = REPORT * 10
        settings = feishu_settings(fake, media_max_bytes=len(REPORT))
        async with (
            serve(
                channel_settings={"feishu": settings},
                workspace_root=str(tmp_path),
                workspace_per_session=True,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            content = {"file_key": "file_v3_big", "file_name": "big.pdf"}
            event = fs.message_event("file", content, chat_id="oc_f2")
            resp = await post_callback(client, srv.url, event)
            assert resp.status_code == 200 and resp.json()["ignored"] == "media too large"
            assert await count(srv.runtime, inbox) == 0
    [reply] = fake.delivered()
    assert "too large" in reply.text and reply.body["receive_id"] == "oc_f2"
    assert not list(tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)


async def test_a_voice_message_is_transcribed_with_speech_to_text(serve: ServeApp) -> None:
    async with FakeOpenAI() as llm, FakeFeishu() as fake:
        fake.resources["file_v3_voice"] = VOICE
        llm.transcript = "remind me to buy milk"
        llm.enqueue(text("Noted."))
        async with (
            serve(
                channel_settings={"feishu": feishu_settings(fake, streaming="off")},
                llm_provider="openai",
                llm_base_url=llm.url,
                llm_api_key="sk-test",
                llm_model="fake-model",
                stt_model="whisper-1",
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = fs.message_event(
                "audio", {"file_key": "file_v3_voice", "duration": 2000}, chat_id="oc_f3"
            )
            assert (await post_callback(client, srv.url, event)).status_code == 200
            await wait_outbox_final(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                query = select(messages.c.content, messages.c.parts).where(messages.c.role == "user")
                [(content, parts)] = (await conn.execute(query)).all()
    assert llm.transcriptions == [{"model": "whisper-1", "audio": VOICE}]
    assert content == "remind me to buy milk"
    assert [(p["type"], p["mime_type"], p["name"]) for p in parts] == [("file", "audio/opus", "voice.opus")]
    assert [c.text for c in fake.delivered()] == ["Noted."]
