"""Videos a follower sends an Official Account (`video`, `shortvideo`; there are no file
messages), fetched by `MediaId` (`cgi-bin/media/get`) and kept in the session's
workspace (per-session workspaces on), or refused when too large."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.db.models import inbox
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count, wait_outbox_final
from tests.channels.wechat_mp.test_wechat_mp import AES_KEY, APP_ID, TOKEN, _post, mp_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.wechat_mp import FakeWeChatMpApi, WeChatMpCallbacks

CLIP = b"\x00\x00\x00\x18ftypmp42 a tiny clip"
SHORT = b"\x00\x00\x00\x18ftypisom a short one"


@pytest.fixture
async def api() -> AsyncIterator[FakeWeChatMpApi]:
    async with FakeWeChatMpApi(app_id=APP_ID) as fake:
        yield fake


@pytest.fixture
def wechat() -> WeChatMpCallbacks:
    return WeChatMpCallbacks(TOKEN, APP_ID, AES_KEY)


def _saved(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("inbox/*"))


async def test_videos_are_kept_in_the_sessions_workspace(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks, tmp_path: Path
) -> None:
    api.media["VID1"] = (CLIP, "video/mp4")
    api.media["SHORT1"] = (SHORT, "video/mp4")
    async with FakeOpenAI() as llm:
        llm.enqueue(text("Nice clip."), text("A short one."))
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(channel_settings={"wechat-mp": mp_settings(api, safe=True)}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            xml = wechat.video("openid-1", "VID1", 31)
            resp = await _post(client, srv.url, wechat.encrypted(xml, openid="openid-1"))
            assert resp.status_code == 200, resp.text
            await wait_outbox_final(srv.runtime)
            xml = wechat.video("openid-1", "SHORT1", 32, kind="shortvideo")
            resp = await _post(client, srv.url, wechat.encrypted(xml, openid="openid-1"))
            assert resp.status_code == 200, resp.text
            await wait_outbox_final(srv.runtime, count=2)
    assert api.media_gets == ["VID1", "SHORT1"]
    first, second = _saved(tmp_path)
    assert first.endswith("/inbox/msg_31-video.mp4")
    assert second.endswith("/inbox/msg_32-shortvideo.mp4")
    assert first.split("/inbox/")[0] == second.split("/inbox/")[0]  # one follower, one session
    assert (tmp_path / first).read_bytes() == CLIP
    assert (tmp_path / second).read_bytes() == SHORT
    first_user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "saved in your workspace as inbox/msg_31-video.mp4" in first_user
    assert [c.body["text"]["content"] for c in api.sent] == ["Nice clip.", "A short one."]


async def test_a_too_large_video_gets_a_polite_reply_and_nothing_is_stored(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks, tmp_path: Path
) -> None:
    api.media["BIG"] = (b"x" * 5000, "video/mp4")
    async with FakeOpenAI() as llm:
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        mp = mp_settings(api, safe=True, media_max_bytes=1000, locale="zh")
        async with (
            serve(channel_settings={"wechat-mp": mp}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            xml = wechat.video("openid-1", "BIG", 33)
            resp = await _post(client, srv.url, wechat.encrypted(xml, openid="openid-1"))
            assert resp.status_code == 200, resp.text
            [sent] = await api.wait_for_sent(1)
            assert await count(srv.runtime, inbox) == 0
    assert sent.body["touser"] == "openid-1"
    assert "太大" in sent.body["text"]["content"]
    assert llm.requests == []
    assert _saved(tmp_path) == []
