"""Files and videos a WeCom member sends, fetched by `MediaId` (`cgi-bin/media/get`) and
kept in the session's workspace (per-session workspaces on), or refused when too large."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from app.db.models import inbox, messages
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count, wait_outbox_final
from tests.channels.wecom.test_wecom import AES_KEY, AGENT_ID, CORP_ID, TOKEN, _post, wecom_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.wecom import FakeWeComApi, WeComCallbacks

REPORT = b"%PDF-1.4\n% a tiny report\n"
CLIP = b"\x00\x00\x00\x18ftypmp42 a tiny clip"


@pytest.fixture
async def api() -> AsyncIterator[FakeWeComApi]:
    async with FakeWeComApi(corp_id=CORP_ID) as fake:
        yield fake


@pytest.fixture
def wecom() -> WeComCallbacks:
    return WeComCallbacks(TOKEN, AES_KEY, CORP_ID, AGENT_ID)


def _saved(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("inbox/*"))


async def test_a_file_and_a_video_are_kept_in_the_sessions_workspace(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks, tmp_path: Path
) -> None:
    api.media["FILE1"] = (REPORT, "application/pdf")
    api.media["VID1"] = (CLIP, "video/mp4")
    async with FakeOpenAI() as llm:
        llm.enqueue(text("Got your report."), text("Nice clip."))
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(channel_settings={"wecom": wecom_settings(api)}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            inner = wecom.file("zhouj", "FILE1", 9001, file_name="report 2026.pdf")
            assert (await _post(client, srv.url, wecom.post(inner))).status_code == 200
            await wait_outbox_final(srv.runtime)
            inner = wecom.video("zhouj", "VID1", 9002)
            assert (await _post(client, srv.url, wecom.post(inner))).status_code == 200
            await wait_outbox_final(srv.runtime, count=2)
            async with srv.runtime.engine.connect() as conn:
                query = select(messages.c.parts).where(messages.c.role == "user").order_by(messages.c.id)
                stored = [r[0] for r in await conn.execute(query)]
    assert api.media_gets == ["FILE1", "VID1"]
    first, second = _saved(tmp_path)
    assert first.endswith("/inbox/msg_9001-report_2026.pdf")
    assert second.endswith("/inbox/msg_9002-video.mp4")
    assert first.split("/inbox/")[0] == second.split("/inbox/")[0]  # one member, one session
    assert (tmp_path / first).read_bytes() == REPORT
    assert (tmp_path / second).read_bytes() == CLIP
    [part] = stored[0]
    assert part["workspace_path"] == "inbox/msg_9001-report_2026.pdf" and part["data_base64"] is None
    assert part["mime_type"] == "application/pdf" and part["size"] == len(REPORT)
    first_user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "saved in your workspace as inbox/msg_9001-report_2026.pdf" in first_user
    second_user = [m for m in llm.requests[1].messages if m["role"] == "user"][-1]["content"]
    assert "saved in your workspace as inbox/msg_9002-video.mp4" in second_user
    assert [c.body["text"]["content"] for c in api.sent] == ["Got your report.", "Nice clip."]


async def test_a_too_large_file_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks, tmp_path: Path
) -> None:
    api.media["BIGFILE"] = (b"x" * 5000, "application/zip")
    async with FakeOpenAI() as llm:
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(channel_settings={"wecom": wecom_settings(api, media_max_bytes=1000)}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            inner = wecom.file("zhouj", "BIGFILE", 9003, file_name="backup.zip")
            resp = await _post(client, srv.url, wecom.post(inner))
            assert resp.status_code == 200, resp.text
            [sent] = await api.wait_for_sent(1)
            assert await count(srv.runtime, inbox) == 0
    assert sent.body["touser"] == "zhouj"
    polite = "Sorry, that file is too large for me to read (the limit is 0.001 MB)."
    assert sent.body["text"]["content"] == polite
    assert llm.requests == []
    assert _saved(tmp_path) == []
