"""QQ message-keyboard buttons end to end (docs/events.md): with `QQ_APPROVAL_BUTTONS` an
approval prompt carries Approve/Deny callback buttons; a press (`INTERACTION_CREATE`, signed
as the platform signs) by an approver approves, is answered `PUT /interactions/{id}`, and a
press redelivered is stored once. The real app against the fake QQ platform."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import approvals, inbox
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.qq.test_qq import APP_ID, SECRET, qq_settings
from tests.channels.support import count, wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.fakes.qq import QQPlatform, c2c_message, interaction, signed_headers
from tests.support.timing import eventually

USER = "E4F4AEA33253A2797FB897C50B81D7ED"


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


async def _post(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    return await client.post(
        f"{url}/channels/qq", content=body, headers=signed_headers(SECRET, body, app_id=APP_ID)
    )


async def test_an_approve_button_press_approves_and_is_answered(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI(default=echo) as model, QQPlatform(APP_ID, SECRET) as platform:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        settings = qq_settings(platform, approval_buttons=True, approvers=[USER])
        async with (
            serve(
                channel_settings={"qq": settings}, **openai_settings(model, workspace_root=str(tmp_path))
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await _post(client, srv.url, c2c_message(USER, "write r.txt"))
            assert resp.status_code == 200, resp.text
            [prompt] = await platform.wait_for(1)
            rows = prompt.body["keyboard"]["content"]["rows"]
            approve, deny = rows[0]["buttons"]
            assert prompt.body["msg_type"] == 2 and "/approve" in prompt.body["markdown"]["content"]
            assert approve["action"]["type"] == 1 and deny["action"]["data"].startswith("deny:")
            press = interaction(approve["action"]["data"], user_openid=USER, interaction_id="int-1")
            resp = await _post(client, srv.url, press)
            assert resp.status_code == 200, resp.text
            again = await _post(client, srv.url, press)  # redelivered: stored once
            assert again.status_code == 200

            async def written() -> bool:
                return any(m.body.get("content") == "Written." for m in platform.sent)

            await eventually(written, timeout=20, message="the approved tool call did not finish")
            await wait_inbox_done(srv.runtime)
            stored = await count(srv.runtime, inbox)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
    assert (tmp_path / "r.txt").read_text() == "ok"
    assert (decided["status"], decided["decided_by"]) == ("approved", USER)
    assert stored == 2  # the message and one press
    assert [(i.path, i.body) for i in platform.interactions][:1] == [("/interactions/int-1", {"code": 0})]
    # Replies after the press are passive: they name the press's event id.
    assert any(m.body.get("event_id") == "int-1" for m in platform.sent)


async def test_another_button_is_a_note_and_a_guild_press_is_ignored(serve: ServeApp) -> None:
    async with FakeOpenAI(default=echo) as model, QQPlatform(APP_ID, SECRET) as platform:
        async with (
            serve(channel_settings={"qq": qq_settings(platform)}, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv.url, c2c_message(USER, "hello"))
            await platform.wait_for(1)
            await _post(client, srv.url, interaction("more", user_openid=USER))
            guild = interaction("approve:1", user_openid=USER)
            guild["d"].update(chat_type=0, scene="guild", guild_id="g1", channel_id="c1")
            del guild["d"]["user_openid"]
            await _post(client, srv.url, guild)
            await wait_inbox_done(srv.runtime)
            stored = await count(srv.runtime, inbox)
            await _post(client, srv.url, c2c_message(USER, "and now?"))
            await platform.wait_for(2)
    assert stored == 2  # the message and the button; not the guild's press
    assert 'pressed the button "more"' in str(model.requests[-1].messages)


async def test_a_prompt_refused_as_markdown_is_sent_as_text(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI(default=echo) as model, QQPlatform(APP_ID, SECRET) as platform:
        platform.refuse_markdown = True
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        settings = qq_settings(platform, approval_buttons=True, approvers=[USER])
        async with (
            serve(
                channel_settings={"qq": settings}, **openai_settings(model, workspace_root=str(tmp_path))
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv.url, c2c_message(USER, "write r.txt"))
            [prompt] = await platform.wait_for(1)
    assert prompt.body["msg_type"] == 0 and "/approve" in prompt.body["content"]
    assert "keyboard" not in prompt.body and platform.message_attempts == 2
