"""OneBot v11 notices end to end (docs/events.md): a recalled answered message has our
answer deleted (`delete_msg`) and is never shown to the model again; a recalled queued
message is not answered; a welcome when configured. A fake bridge on the reverse
WebSocket, the fake OpenAI server as the model."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from app.db.models import inbox
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.onebot.test_onebot import BOT, TOKEN, onebot_settings, ws_url
from tests.channels.support import count, session_messages, wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes.onebot import FakeBridge, group_message, member_notice, private_message, recall_notice
from tests.fakes.openai_server import FakeOpenAI, Reply, text
from tests.support.timing import eventually

GROUP, MEMBER = 555, 42


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


def _accepted(srv: Any, rows: int) -> Any:
    async def check() -> bool:
        return await count(srv.runtime, inbox) >= rows

    return check


def to_bot(text_: str) -> list[dict[str, Any]]:
    return [{"type": "at", "data": {"qq": str(BOT)}}, {"type": "text", "data": {"text": f" {text_}"}}]


async def test_a_group_recall_deletes_our_answer_and_the_model_never_sees_the_message_again(
    serve: ServeApp,
) -> None:
    async with FakeOpenAI(default=echo) as model:
        async with (
            serve(channel_settings={"onebot": onebot_settings()}, **openai_settings(model)) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await bridge.send_event(
                group_message(BOT, GROUP, MEMBER, to_bot("my PIN is 8812"), message_id=70)
            )
            [answer] = await bridge.wait_for_actions(1)
            assert answer.action == "send_group_msg"
            answered_id = bridge.sent_ids[0]
            await wait_inbox_done(srv.runtime)

            await bridge.send_event(recall_notice(BOT, MEMBER, 70, group_id=GROUP))
            actions = await bridge.wait_for_actions(2)
            assert (actions[1].action, actions[1].params) == ("delete_msg", {"message_id": answered_id})
            await wait_inbox_done(srv.runtime)

            await bridge.send_event(
                group_message(BOT, GROUP, MEMBER, to_bot("what did I tell you?"), message_id=71)
            )
            await bridge.wait_for_actions(3)
            history = await session_messages(client, srv.url, f"onebot:group%3A{GROUP}")
    assert len(model.requests) == 2
    assert "8812" in str(model.requests[0].messages)
    assert "8812" not in str(model.requests[1].messages)  # hidden from the model from then on
    assert any("recalled an earlier message" in str(m["content"]) for m in model.requests[1].messages)
    # Append-only: the recalled exchange stays in the stored history.
    assert [m["content"] for m in history if m["role"] == "user"] == [
        "my PIN is 8812",
        "what did I tell you?",
    ]


async def test_a_recalled_queued_message_is_not_answered(serve: ServeApp) -> None:
    hold = asyncio.Event()
    async with FakeOpenAI(default=echo) as model:
        model.enqueue(text("echo first", hold=hold))
        async with (
            serve(channel_settings={"onebot": onebot_settings()}, **openai_settings(model)) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            await bridge.send_event(private_message(BOT, MEMBER, "first", message_id=80))
            await model.wait_requests(1)
            await bridge.send_event(private_message(BOT, MEMBER, "oops, wrong chat", message_id=81))
            await bridge.send_event(recall_notice(BOT, MEMBER, 81))
            await bridge.send_event(private_message(BOT, MEMBER, "third", message_id=82))
            # All in the inbox (a WebSocket event has no acknowledgement) before "first" ends.
            await eventually(_accepted(srv, 4))
            hold.set()
            await bridge.wait_for_actions(2)
            await wait_inbox_done(srv.runtime)
            sent = [a for a in bridge.actions if a.action == "send_private_msg"]
    assert [a.params["message"][0]["data"]["text"] for a in sent] == ["echo first", "echo third"]
    assert all("wrong chat" not in str(r.messages) for r in model.requests)
    assert not [a for a in bridge.actions if a.action == "delete_msg"]


async def test_a_welcome_is_said_only_when_configured(serve: ServeApp) -> None:
    settings = {"onebot": onebot_settings(welcome_text="Welcome, {name}!")}
    async with serve(channel_settings=settings) as srv, FakeBridge(ws_url(srv), BOT, TOKEN) as bridge:
        await bridge.send_event(member_notice(BOT, GROUP, 99, joined=True))
        [said] = await bridge.wait_for_actions(1)
        await bridge.send_event(member_notice(BOT, GROUP, 99, joined=False))  # no farewell set
        await wait_inbox_done(srv.runtime)
    assert said.action == "send_group_msg"
    assert said.params["message"] == [{"type": "text", "data": {"text": "Welcome, 99!"}}]
    assert len(bridge.actions) == 1
